//! Which tools each server may show, under which names, and who holds each advertised name.
//!
//! Collisions fail closed: tools whose names collide within one server are all withheld; across
//! servers the current holder of a name keeps it and the newcomer's tool is withheld until the
//! name is free again.

use std::collections::{BTreeMap, BTreeSet};

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

use crate::model::{Action, Publication, PublishedTool, Tool};
use crate::naming::advertised_name_with;

/// Compiled include/exclude globs over original tool names.
#[derive(Debug, Clone)]
pub struct Filters {
    include: Option<GlobSet>,
    exclude: GlobSet,
}

impl Filters {
    /// Compiles the patterns; an invalid one is an error naming it.
    pub fn compile(include: &[String], exclude: &[String]) -> Result<Filters, String> {
        let include = if include.is_empty() {
            None
        } else {
            Some(build_set(include, "include")?)
        };
        let exclude = build_set(exclude, "exclude")?;
        Ok(Filters { include, exclude })
    }

    /// Include (when given) must match and exclude must not: exclude always wins.
    pub fn allows(&self, tool: &str) -> bool {
        let included = self.include.as_ref().is_none_or(|set| set.is_match(tool));
        included && !self.exclude.is_match(tool)
    }
}

fn build_set(patterns: &[String], what: &str) -> Result<GlobSet, String> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        let glob =
            Glob::new(pattern).map_err(|e| format!("invalid {what} pattern {pattern:?}: {e}"))?;
        builder.add(glob);
    }
    builder
        .build()
        .map_err(|e| format!("invalid {what} patterns: {e}"))
}

/// What a server would publish right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Publishable tools, sorted by advertised name.
    pub tools: Vec<PublishedTool>,
    /// Names withheld because another server holds them (re-offered when they are freed).
    pub blocked: BTreeSet<String>,
    /// Collisions, for the log.
    pub warnings: Vec<String>,
}

/// Publications and the name table, for all servers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registry {
    /// Advertised name -> the server holding it.
    owners: BTreeMap<String, String>,
    /// Server -> its current publication (never empty: no tools means no publication).
    published: BTreeMap<String, Vec<PublishedTool>>,
    /// Server -> names it would publish but another server holds.
    blocked: BTreeMap<String, BTreeSet<String>>,
}

impl Registry {
    /// Computes what `server` may publish from its session's `tools`, named with the
    /// operator's `prefix` (`None`: `<server>__`).
    pub fn plan(
        &self,
        server: &str,
        prefix: Option<&str>,
        tools: &[Tool],
        filters: &Filters,
    ) -> Plan {
        let mut by_name: BTreeMap<String, Vec<&Tool>> = BTreeMap::new();
        for tool in tools.iter().filter(|t| filters.allows(&t.name)) {
            by_name
                .entry(advertised_name_with(prefix, server, &tool.name))
                .or_default()
                .push(tool);
        }
        let mut plan = Plan {
            tools: Vec::new(),
            blocked: BTreeSet::new(),
            warnings: Vec::new(),
        };
        for (advertised, group) in by_name {
            if let [tool] = group.as_slice() {
                match self.owners.get(&advertised) {
                    Some(owner) if owner != server => {
                        plan.warnings.push(format!(
                            "server {server:?}: tool {:?} withheld: its name {advertised:?} is already used by server {owner:?}",
                            tool.name
                        ));
                        plan.blocked.insert(advertised);
                    }
                    _ => plan.tools.push(PublishedTool {
                        advertised,
                        original: tool.name.clone(),
                        revision: tool.revision,
                        read_only: tool.read_only,
                    }),
                }
            } else {
                let names: Vec<&str> = group.iter().map(|t| t.name.as_str()).collect();
                plan.warnings.push(format!(
                    "server {server:?}: tools {names:?} withheld: they all map to the name {advertised:?}"
                ));
            }
        }
        plan
    }

    /// Installs `plan` as the server's publication. Returns the action (only if the visible set
    /// changes) and the names the server gave up.
    pub fn apply(&mut self, server: &str, plan: Plan) -> (Option<Action>, BTreeSet<String>) {
        if plan.blocked.is_empty() {
            self.blocked.remove(server);
        } else {
            self.blocked.insert(server.to_string(), plan.blocked);
        }
        if plan.tools.is_empty() {
            return self.release(server);
        }
        if self.published.get(server) == Some(&plan.tools) {
            return (None, BTreeSet::new());
        }
        let old = self.published.remove(server).unwrap_or_default();
        let new_names: BTreeSet<&str> = plan.tools.iter().map(|t| t.advertised.as_str()).collect();
        let mut freed = BTreeSet::new();
        for tool in &old {
            if !new_names.contains(tool.advertised.as_str()) {
                self.owners.remove(&tool.advertised);
                freed.insert(tool.advertised.clone());
            }
        }
        for tool in &plan.tools {
            self.owners
                .insert(tool.advertised.clone(), server.to_string());
        }
        self.published
            .insert(server.to_string(), plan.tools.clone());
        let action = Action::PublishTools(Publication {
            server: server.to_string(),
            tools: plan.tools,
        });
        (Some(action), freed)
    }

    /// THE withdrawal: hides the server's tools if it has any visible (so the host sees exactly
    /// one `WithdrawTools` per publication), frees its names and stops it waiting for names.
    pub fn withdraw(&mut self, server: &str) -> (Option<Action>, BTreeSet<String>) {
        self.blocked.remove(server);
        self.release(server)
    }

    fn release(&mut self, server: &str) -> (Option<Action>, BTreeSet<String>) {
        let Some(old) = self.published.remove(server) else {
            return (None, BTreeSet::new());
        };
        let mut freed = BTreeSet::new();
        for tool in old {
            self.owners.remove(&tool.advertised);
            freed.insert(tool.advertised);
        }
        (Some(Action::WithdrawTools(server.to_string())), freed)
    }

    /// Servers (in name order) waiting for any of `freed`.
    pub fn waiting_for(&self, freed: &BTreeSet<String>) -> Vec<String> {
        self.blocked
            .iter()
            .filter(|(_, names)| !names.is_disjoint(freed))
            .map(|(server, _)| server.clone())
            .collect()
    }

    /// Number of tools the server currently shows.
    pub fn published_count(&self, server: &str) -> u32 {
        self.published
            .get(server)
            .map_or(0, |tools| u32::try_from(tools.len()).unwrap_or(u32::MAX))
    }

    /// The server's current publication, if any.
    pub fn publication(&self, server: &str) -> Option<&[PublishedTool]> {
        self.published.get(server).map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        Tool {
            name: name.into(),
            read_only: false,
            revision: name.len() as u64,
        }
    }

    fn tools(names: &[&str]) -> Vec<Tool> {
        names.iter().map(|n| tool(n)).collect()
    }

    fn no_filters() -> Filters {
        Filters::compile(&[], &[]).unwrap()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn advertised(action: &Option<Action>) -> Vec<String> {
        match action {
            Some(Action::PublishTools(p)) => p.tools.iter().map(|t| t.advertised.clone()).collect(),
            other => panic!("expected a publication, got {other:?}"),
        }
    }

    #[test]
    fn publication_is_sorted_by_advertised_name_and_keeps_tool_fields() {
        let mut r = Registry::default();
        let plan = r.plan("s", None, &tools(&["zeta", "alpha"]), &no_filters());
        let (action, _) = r.apply("s", plan);
        assert_eq!(advertised(&action), ["s__alpha", "s__zeta"]);
        let Some(Action::PublishTools(p)) = action else {
            unreachable!()
        };
        assert_eq!(p.tools[0].original, "alpha");
        assert_eq!(p.tools[0].revision, 5);
        assert_eq!(r.published_count("s"), 2);
    }

    #[test]
    fn include_limits_and_exclude_always_wins() {
        let f =
            Filters::compile(&strings(&["read_*", "list"]), &strings(&["read_secret*"])).unwrap();
        assert!(f.allows("read_file"));
        assert!(f.allows("list"));
        assert!(!f.allows("write_file"));
        assert!(!f.allows("read_secret_key"));
        let only_exclude = Filters::compile(&[], &strings(&["delete*"])).unwrap();
        assert!(only_exclude.allows("anything"));
        assert!(!only_exclude.allows("delete_all"));
    }

    #[test]
    fn invalid_glob_is_an_error_naming_the_pattern() {
        let e = Filters::compile(&strings(&["[abc"]), &[]).unwrap_err();
        assert!(e.contains("include pattern \"[abc\""), "{e}");
        let e = Filters::compile(&[], &strings(&["{a"])).unwrap_err();
        assert!(e.contains("exclude pattern"), "{e}");
    }

    #[test]
    fn same_tools_again_publish_nothing() {
        let mut r = Registry::default();
        let plan = r.plan("s", None, &tools(&["a"]), &no_filters());
        assert!(r.apply("s", plan).0.is_some());
        let plan = r.plan("s", None, &tools(&["a"]), &no_filters());
        assert_eq!(r.apply("s", plan).0, None);
    }

    #[test]
    fn tools_colliding_within_one_server_are_all_withheld() {
        let r = Registry::default();
        let plan = r.plan("s", None, &tools(&["a.b", "a/b", "ok"]), &no_filters());
        let names: Vec<_> = plan.tools.iter().map(|t| t.advertised.as_str()).collect();
        assert_eq!(names, ["s__ok"]);
        assert_eq!(plan.warnings.len(), 1);
        assert!(
            plan.warnings[0].contains("\"s__a_b\""),
            "{}",
            plan.warnings[0]
        );
    }

    #[test]
    fn the_holder_keeps_a_name_and_the_newcomer_is_withheld_across_servers() {
        let mut r = Registry::default();
        // "a" + "__" + "b__c" and "a__b" + "__" + "c" both advertise "a__b__c".
        let plan = r.plan("a", None, &tools(&["b__c"]), &no_filters());
        r.apply("a", plan);
        let plan = r.plan("a__b", None, &tools(&["c", "d"]), &no_filters());
        assert_eq!(plan.blocked.iter().collect::<Vec<_>>(), ["a__b__c"]);
        assert_eq!(plan.warnings.len(), 1);
        let (action, _) = r.apply("a__b", plan);
        assert_eq!(advertised(&action), ["a__b__d"]);
        // Freed when the holder withdraws; the waiting server is named.
        let (action, freed) = r.withdraw("a");
        assert_eq!(action, Some(Action::WithdrawTools("a".into())));
        assert_eq!(r.waiting_for(&freed), ["a__b"]);
        let plan = r.plan("a__b", None, &tools(&["c", "d"]), &no_filters());
        let (action, _) = r.apply("a__b", plan);
        assert_eq!(advertised(&action), ["a__b__c", "a__b__d"]);
    }

    #[test]
    fn withdraw_emits_once_per_publication() {
        let mut r = Registry::default();
        let plan = r.plan("s", None, &tools(&["a"]), &no_filters());
        r.apply("s", plan);
        assert_eq!(r.withdraw("s").0, Some(Action::WithdrawTools("s".into())));
        assert_eq!(r.withdraw("s").0, None);
        assert_eq!(r.published_count("s"), 0);
    }

    #[test]
    fn an_empty_plan_withdraws_what_was_visible() {
        let mut r = Registry::default();
        let plan = r.plan("s", None, &tools(&["a"]), &no_filters());
        r.apply("s", plan);
        let plan = r.plan("s", None, &[], &no_filters());
        assert_eq!(
            r.apply("s", plan).0,
            Some(Action::WithdrawTools("s".into()))
        );
        let plan = r.plan("s", None, &[], &no_filters());
        assert_eq!(r.apply("s", plan).0, None);
    }

    #[test]
    fn republishing_frees_names_no_longer_used() {
        let mut r = Registry::default();
        let plan = r.plan("s", None, &tools(&["a", "b"]), &no_filters());
        r.apply("s", plan);
        let plan = r.plan("s", None, &tools(&["b"]), &no_filters());
        let (action, freed) = r.apply("s", plan);
        assert_eq!(advertised(&action), ["s__b"]);
        assert_eq!(freed.into_iter().collect::<Vec<_>>(), ["s__a"]);
    }
}
