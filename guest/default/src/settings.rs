//! Policy settings: defaults, JSON parsing with deep-merged overrides, validation.
//!
//! Parsing is done by hand (not by serde) so that every error names the offending key
//! (`backoff.cap_ms`), which serde's messages do not. The serde derives serve snapshots.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How a backoff delay is randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Jitter {
    /// Uniform in `[0, d]`.
    Full,
    /// `min(cap, uniform in [base, previous * 3])`.
    Decorrelated,
    /// Exactly `d`.
    None,
}

impl Jitter {
    fn parse(text: &str) -> Option<Jitter> {
        match text {
            "full" => Some(Jitter::Full),
            "decorrelated" => Some(Jitter::Decorrelated),
            "none" => Some(Jitter::None),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackoffSettings {
    pub base_ms: u64,
    pub cap_ms: u64,
    pub factor: f64,
    pub jitter: Jitter,
}

impl Default for BackoffSettings {
    fn default() -> Self {
        BackoffSettings {
            base_ms: 1_000,
            cap_ms: 60_000,
            factor: 2.0,
            jitter: Jitter::Full,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParkSettings {
    pub probe_initial_ms: u64,
    pub probe_max_ms: u64,
}

impl Default for ParkSettings {
    fn default() -> Self {
        ParkSettings {
            probe_initial_ms: 30_000,
            probe_max_ms: 1_800_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSettings {
    pub failure_threshold: u32,
    pub open_ms: u64,
    pub open_max_ms: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            failure_threshold: 3,
            open_ms: 60_000,
            open_max_ms: 600_000,
        }
    }
}

/// The longest hold a host accepts (contract 0.2).
pub const MAX_HOLD_MS: u64 = 60_000;

/// All tunables of the default policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Connect attempts before the first ever session, then park.
    pub initial_attempts: u32,
    /// Consecutive failures without a proven session, then park.
    pub reconnect_budget: u32,
    pub backoff: BackoffSettings,
    /// Seeds the per-server jitter generators.
    pub seed: u64,
    pub park: ParkSettings,
    pub breaker: BreakerSettings,
    /// How long a call may be held for a fresh session that is on its way (an attempt in
    /// flight, or one due within this time); 0: never hold, refuse at once.
    pub hold_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            initial_attempts: 4,
            reconnect_budget: 5,
            backoff: BackoffSettings::default(),
            seed: 0,
            park: ParkSettings::default(),
            breaker: BreakerSettings::default(),
            hold_ms: 2_000,
        }
    }
}

impl Settings {
    /// Parses settings JSON over the defaults (`""` means all defaults).
    pub fn from_json(json: &str) -> Result<Settings, String> {
        Settings::default().merged(json)
    }

    /// These settings with the JSON object `json` deep-merged over them, validated.
    pub fn merged(&self, json: &str) -> Result<Settings, String> {
        let mut merged = self.clone();
        if let Some(overrides) = parse_object(json)? {
            merged.apply(&overrides)?;
        }
        merged.validate()?;
        Ok(merged)
    }

    fn apply(&mut self, obj: &Map<String, Value>) -> Result<(), String> {
        for (key, value) in obj {
            match key.as_str() {
                "initial_attempts" => self.initial_attempts = u32_field(value, "initial_attempts")?,
                "reconnect_budget" => self.reconnect_budget = u32_field(value, "reconnect_budget")?,
                "seed" => self.seed = u64_field(value, "seed")?,
                "hold_ms" => self.hold_ms = u64_field(value, "hold_ms")?,
                "backoff" => {
                    for (key, value) in section(value, "backoff")? {
                        let b = &mut self.backoff;
                        match key.as_str() {
                            "base_ms" => b.base_ms = u64_field(value, "backoff.base_ms")?,
                            "cap_ms" => b.cap_ms = u64_field(value, "backoff.cap_ms")?,
                            "factor" => b.factor = f64_field(value, "backoff.factor")?,
                            "jitter" => b.jitter = jitter_field(value, "backoff.jitter")?,
                            other => return Err(unknown("backoff.", other)),
                        }
                    }
                }
                "park" => {
                    for (key, value) in section(value, "park")? {
                        let p = &mut self.park;
                        match key.as_str() {
                            "probe_initial_ms" => {
                                p.probe_initial_ms = u64_field(value, "park.probe_initial_ms")?
                            }
                            "probe_max_ms" => {
                                p.probe_max_ms = u64_field(value, "park.probe_max_ms")?
                            }
                            other => return Err(unknown("park.", other)),
                        }
                    }
                }
                "breaker" => {
                    for (key, value) in section(value, "breaker")? {
                        let b = &mut self.breaker;
                        match key.as_str() {
                            "failure_threshold" => {
                                b.failure_threshold = u32_field(value, "breaker.failure_threshold")?
                            }
                            "open_ms" => b.open_ms = u64_field(value, "breaker.open_ms")?,
                            "open_max_ms" => {
                                b.open_max_ms = u64_field(value, "breaker.open_max_ms")?
                            }
                            other => return Err(unknown("breaker.", other)),
                        }
                    }
                }
                other => return Err(unknown("", other)),
            }
        }
        Ok(())
    }

    /// Checks the combined values; every error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.initial_attempts < 1 {
            return Err("setting `initial_attempts` must be at least 1".into());
        }
        if self.reconnect_budget < 1 {
            return Err("setting `reconnect_budget` must be at least 1".into());
        }
        if self.hold_ms > MAX_HOLD_MS {
            return Err(format!(
                "setting `hold_ms` must be at most {MAX_HOLD_MS} (got {})",
                self.hold_ms
            ));
        }
        let b = &self.backoff;
        if !b.factor.is_finite() || b.factor < 1.0 {
            return Err(format!(
                "setting `backoff.factor` must be a number of at least 1 (got {})",
                b.factor
            ));
        }
        if b.base_ms > b.cap_ms {
            return Err(format!(
                "setting `backoff.base_ms` ({}) must not exceed `backoff.cap_ms` ({})",
                b.base_ms, b.cap_ms
            ));
        }
        let p = &self.park;
        if p.probe_initial_ms < 1 {
            return Err("setting `park.probe_initial_ms` must be at least 1".into());
        }
        if p.probe_initial_ms > p.probe_max_ms {
            return Err(format!(
                "setting `park.probe_initial_ms` ({}) must not exceed `park.probe_max_ms` ({})",
                p.probe_initial_ms, p.probe_max_ms
            ));
        }
        let k = &self.breaker;
        if k.failure_threshold < 1 {
            return Err("setting `breaker.failure_threshold` must be at least 1".into());
        }
        if k.open_ms < 1 {
            return Err("setting `breaker.open_ms` must be at least 1".into());
        }
        if k.open_ms > k.open_max_ms {
            return Err(format!(
                "setting `breaker.open_ms` ({}) must not exceed `breaker.open_max_ms` ({})",
                k.open_ms, k.open_max_ms
            ));
        }
        Ok(())
    }
}

/// `None` for an empty (or blank) string, the object otherwise.
fn parse_object(json: &str) -> Result<Option<Map<String, Value>>, String> {
    if json.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(obj)) => Ok(Some(obj)),
        Ok(_) => Err("settings must be a JSON object".into()),
        Err(e) => Err(format!("settings are not valid JSON: {e}")),
    }
}

fn unknown(prefix: &str, key: &str) -> String {
    format!("unknown setting `{prefix}{key}`")
}

fn section<'a>(value: &'a Value, key: &str) -> Result<&'a Map<String, Value>, String> {
    value
        .as_object()
        .ok_or_else(|| format!("setting `{key}` must be a JSON object"))
}

fn u64_field(value: &Value, key: &str) -> Result<u64, String> {
    value
        .as_u64()
        .ok_or_else(|| format!("setting `{key}` must be a non-negative integer"))
}

fn u32_field(value: &Value, key: &str) -> Result<u32, String> {
    let n = u64_field(value, key)?;
    u32::try_from(n).map_err(|_| format!("setting `{key}` must be at most {}", u32::MAX))
}

fn f64_field(value: &Value, key: &str) -> Result<f64, String> {
    value
        .as_f64()
        .ok_or_else(|| format!("setting `{key}` must be a number"))
}

fn jitter_field(value: &Value, key: &str) -> Result<Jitter, String> {
    value.as_str().and_then(Jitter::parse).ok_or_else(|| {
        format!("setting `{key}` must be one of \"full\", \"decorrelated\", \"none\"")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_string_and_empty_object_give_the_defaults() {
        assert_eq!(Settings::from_json("").unwrap(), Settings::default());
        assert_eq!(Settings::from_json("  ").unwrap(), Settings::default());
        assert_eq!(Settings::from_json("{}").unwrap(), Settings::default());
    }

    #[test]
    fn defaults_match_the_brief() {
        let s = Settings::default();
        assert_eq!(s.initial_attempts, 4);
        assert_eq!(s.reconnect_budget, 5);
        assert_eq!(s.backoff.base_ms, 1_000);
        assert_eq!(s.backoff.cap_ms, 60_000);
        assert_eq!(s.backoff.factor, 2.0);
        assert_eq!(s.backoff.jitter, Jitter::Full);
        assert_eq!(s.seed, 0);
        assert_eq!(s.park.probe_initial_ms, 30_000);
        assert_eq!(s.park.probe_max_ms, 1_800_000);
        assert_eq!(s.breaker.failure_threshold, 3);
        assert_eq!(s.breaker.open_ms, 60_000);
        assert_eq!(s.breaker.open_max_ms, 600_000);
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let e = Settings::from_json(r#"{"retries": 3}"#).unwrap_err();
        assert_eq!(e, "unknown setting `retries`");
        let e = Settings::from_json(r#"{"backoff": {"bse_ms": 3}}"#).unwrap_err();
        assert_eq!(e, "unknown setting `backoff.bse_ms`");
    }

    #[test]
    fn nested_objects_are_deep_merged() {
        let base =
            Settings::from_json(r#"{"backoff": {"base_ms": 500, "jitter": "none"}}"#).unwrap();
        let merged = base.merged(r#"{"backoff": {"cap_ms": 9000}}"#).unwrap();
        assert_eq!(merged.backoff.base_ms, 500);
        assert_eq!(merged.backoff.cap_ms, 9_000);
        assert_eq!(merged.backoff.jitter, Jitter::None);
        assert_eq!(merged.initial_attempts, 4);
    }

    #[test]
    fn invalid_values_are_errors_naming_the_key() {
        let cases = [
            (r#"{"initial_attempts": 0}"#, "initial_attempts"),
            (r#"{"reconnect_budget": 0}"#, "reconnect_budget"),
            (r#"{"initial_attempts": -1}"#, "initial_attempts"),
            (r#"{"initial_attempts": 5000000000}"#, "initial_attempts"),
            (r#"{"seed": "x"}"#, "seed"),
            (r#"{"backoff": {"factor": 0.5}}"#, "backoff.factor"),
            (
                r#"{"backoff": {"base_ms": 10, "cap_ms": 5}}"#,
                "backoff.base_ms",
            ),
            (r#"{"backoff": {"jitter": "equal"}}"#, "backoff.jitter"),
            (r#"{"backoff": 3}"#, "backoff"),
            (
                r#"{"park": {"probe_initial_ms": 0}}"#,
                "park.probe_initial_ms",
            ),
            (r#"{"park": {"probe_max_ms": 10}}"#, "park.probe_initial_ms"),
            (
                r#"{"breaker": {"failure_threshold": 0}}"#,
                "breaker.failure_threshold",
            ),
            (r#"{"breaker": {"open_ms": 0}}"#, "breaker.open_ms"),
            (r#"{"breaker": {"open_max_ms": 10}}"#, "breaker.open_ms"),
        ];
        for (json, key) in cases {
            let e = Settings::from_json(json).unwrap_err();
            assert!(e.contains(&format!("`{key}`")), "{json}: {e}");
        }
    }

    #[test]
    fn non_object_or_broken_json_is_rejected() {
        assert_eq!(
            Settings::from_json("[1]").unwrap_err(),
            "settings must be a JSON object"
        );
        assert!(
            Settings::from_json("{")
                .unwrap_err()
                .starts_with("settings are not valid JSON")
        );
    }

    #[test]
    fn all_jitter_modes_parse() {
        for (text, jitter) in [
            ("full", Jitter::Full),
            ("decorrelated", Jitter::Decorrelated),
            ("none", Jitter::None),
        ] {
            let s =
                Settings::from_json(&format!(r#"{{"backoff": {{"jitter": "{text}"}}}}"#)).unwrap();
            assert_eq!(s.backoff.jitter, jitter);
        }
    }

    #[test]
    fn settings_round_trip_through_serde() {
        let s = Settings::from_json(r#"{"backoff": {"factor": 1.7}, "seed": 42}"#).unwrap();
        let json = serde_json::to_string(&s).unwrap();
        let back: Settings = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }
}
