//! The default policy component: exports [`tether_policy::Policy`] through the shared glue.

tether_policy::export_policy_logic!(tether_policy::Policy);
