//! The default policy component: exports [`tether_policy::Policy`] through the policy SDK.

tether_policy_sdk::export_policy_logic!(tether_policy::Policy);
