//! The host's routing table: exactly what the policy published, nothing more. Agents see these
//! tools; calls are routed by advertised name to (server, original tool name). Every change bumps
//! a generation and is broadcast, which feeds `notifications/tools/list_changed` downstream.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock, RwLock};

use tokio::sync::broadcast;

use crate::policy::{Publication, PublishedTool};

/// Where an advertised tool goes. Made with [`Route::new`] and never changed after: the view
/// for agents it keeps is made from `tool` once.
#[derive(Debug, Clone)]
pub struct Route {
    /// The server that serves it.
    pub server: String,
    /// The tool as published (its `original` is the name on the server).
    pub tool: PublishedTool,
    /// The tool as agents see it, made once by the gateway: a 2026-07-28 call is checked
    /// against it on every call, and making it parses the schema.
    pub(crate) for_agents: OnceLock<rmcp::model::Tool>,
}

impl Route {
    pub fn new(server: String, tool: PublishedTool) -> Self {
        Self {
            server,
            tool,
            for_agents: OnceLock::new(),
        }
    }
}

/// What the route is, not what was made from it.
impl PartialEq for Route {
    fn eq(&self, other: &Self) -> bool {
        (&self.server, &self.tool) == (&other.server, &other.tool)
    }
}

/// One change of the visible tool set.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct RegistryChange {
    /// The generation the change produced.
    pub generation: u64,
    /// The server whose tools changed.
    pub server: String,
    /// Advertised names that became visible.
    pub added: Vec<String>,
    /// Advertised names that were hidden.
    pub removed: Vec<String>,
}

#[derive(Default)]
struct Tables {
    generation: u64,
    by_server: BTreeMap<String, Vec<PublishedTool>>,
    routes: BTreeMap<String, Arc<Route>>,
    /// Tools withdrawn while their server is still configured: agents holding an old list may
    /// still call them, and deserve the policy's words ("reconnecting, retry in N s") rather
    /// than "unknown tool". Never listed.
    withdrawn: BTreeMap<String, Arc<Route>>,
}

/// The visible tools and their routes, as the policy published them.
pub struct Registry {
    tables: RwLock<Tables>,
    changes: broadcast::Sender<RegistryChange>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            tables: RwLock::default(),
            changes: broadcast::channel(1024).0,
        }
    }
}

impl Registry {
    /// Replaces a server's visible tools with the policy's publication. A publication of the
    /// tools already visible (in any order) changes nothing and is not broadcast. Returns
    /// whether the visible tools changed.
    pub fn publish(&self, publication: Publication) -> bool {
        let server = publication.server.clone();
        self.replace(&server, publication.tools)
    }

    /// Hides all of a server's tools. Idempotent: withdrawing nothing changes nothing (and
    /// returns false).
    pub fn withdraw(&self, server: &str) -> bool {
        self.replace(server, Vec::new())
    }

    fn replace(&self, server: &str, mut tools: Vec<PublishedTool>) -> bool {
        // Agents see the tools by name, in no order of the policy's.
        tools.sort_by(|a, b| a.advertised.cmp(&b.advertised));
        let change = {
            let mut tables = self.tables.write().unwrap_or_else(|e| e.into_inner());
            let old: BTreeSet<String> = tables
                .by_server
                .get(server)
                .map(|tools| tools.iter().map(|t| t.advertised.clone()).collect())
                .unwrap_or_default();
            let new: BTreeSet<String> = tools.iter().map(|t| t.advertised.clone()).collect();
            let unchanged = tables
                .by_server
                .get(server)
                .map_or(tools.is_empty(), |current| *current == tools);
            if unchanged {
                return false;
            }
            // Only the server's last withdrawn set stays routable: names it dropped before
            // are forgotten (a server whose tool names churn would grow the map for ever).
            tables.withdrawn.retain(|_, route| route.server != server);
            for name in &old {
                if let Some(route) = tables.routes.remove(name) {
                    tables.withdrawn.insert(name.clone(), route);
                }
            }
            for tool in &tools {
                tables.withdrawn.remove(&tool.advertised);
                tables.routes.insert(
                    tool.advertised.clone(),
                    Arc::new(Route::new(server.to_string(), tool.clone())),
                );
            }
            if tools.is_empty() {
                tables.by_server.remove(server);
            } else {
                tables.by_server.insert(server.to_string(), tools);
            }
            tables.generation += 1;
            RegistryChange {
                generation: tables.generation,
                server: server.to_string(),
                added: new.difference(&old).cloned().collect(),
                removed: old.difference(&new).cloned().collect(),
            }
        };
        tracing::info!(
            server = %change.server,
            generation = change.generation,
            added = ?change.added,
            removed = ?change.removed,
            "visible tools changed"
        );
        let _ = self.changes.send(change);
        true
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The route of a visible tool (shared: a call copies no description or schema).
    pub fn route(&self, advertised: &str) -> Option<Arc<Route>> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .routes
            .get(advertised)
            .cloned()
    }

    /// The route of a visible tool, or of one withdrawn from a server still configured.
    pub fn route_for_call(&self, advertised: &str) -> Option<Arc<Route>> {
        let tables = self.tables.read().unwrap_or_else(|e| e.into_inner());
        tables
            .routes
            .get(advertised)
            .or_else(|| tables.withdrawn.get(advertised))
            .cloned()
    }

    /// Forgets a removed server entirely (its tools must already be withdrawn).
    pub fn forget(&self, server: &str) {
        let _ = self.withdraw(server);
        self.tables
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .withdrawn
            .retain(|_, route| route.server != server);
    }

    /// Every visible tool, sorted by advertised name, with the generation it belongs to.
    pub fn snapshot(&self) -> (u64, Vec<Arc<Route>>) {
        let tables = self.tables.read().unwrap_or_else(|e| e.into_inner());
        (tables.generation, tables.routes.values().cloned().collect())
    }

    /// The route of a visible tool (not one just withdrawn).
    pub fn visible_route(&self, advertised: &str) -> Option<Arc<Route>> {
        let tables = self.tables.read().unwrap_or_else(|e| e.into_inner());
        tables.routes.get(advertised).cloned()
    }

    /// Whether agents can see (or just lost) a tool of this name.
    pub fn knows(&self, advertised: &str) -> bool {
        let tables = self.tables.read().unwrap_or_else(|e| e.into_inner());
        tables.routes.contains_key(advertised) || tables.withdrawn.contains_key(advertised)
    }

    /// The original names of a server's visible tools.
    pub fn server_originals(&self, server: &str) -> BTreeSet<String> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_server
            .get(server)
            .map(|tools| tools.iter().map(|t| t.original.clone()).collect())
            .unwrap_or_default()
    }

    /// Advertised names of one server's visible tools.
    pub fn server_tools(&self, server: &str) -> Vec<String> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_server
            .get(server)
            .map(|tools| tools.iter().map(|t| t.advertised.clone()).collect())
            .unwrap_or_default()
    }

    /// The current generation; every change of the visible tools bumps it.
    pub fn generation(&self) -> u64 {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .generation
    }

    /// Changes of the visible tools as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<RegistryChange> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> PublishedTool {
        PublishedTool {
            advertised: format!("s__{name}"),
            original: name.into(),
            description: None,
            input_schema: "{}".into(),
            extra: String::new(),
            read_only: false,
        }
    }

    fn publish(registry: &Registry, tools: &[&str]) -> bool {
        registry.publish(Publication {
            server: "s".into(),
            tools: tools.iter().map(|t| tool(t)).collect(),
        })
    }

    #[test]
    fn publishing_routes_tools_and_reports_the_diff() {
        let registry = Registry::default();
        let mut changes = registry.subscribe();
        publish(&registry, &["a", "b"]);
        publish(&registry, &["b", "c"]);
        assert_eq!(registry.route("s__c").unwrap().tool.original, "c");
        assert!(registry.route("s__a").is_none());
        let first = changes.try_recv().unwrap();
        assert_eq!(first.added, ["s__a", "s__b"]);
        let second = changes.try_recv().unwrap();
        assert_eq!(
            (second.added.clone(), second.removed.clone()),
            (vec!["s__c".to_string()], vec!["s__a".to_string()])
        );
        assert_eq!(second.generation, 2);
    }

    #[test]
    fn unchanged_publications_and_repeated_withdrawals_change_nothing() {
        let registry = Registry::default();
        let mut changes = registry.subscribe();
        assert!(!registry.withdraw("s"), "nothing was published");
        assert!(publish(&registry, &["a", "b"]));
        assert!(!publish(&registry, &["a", "b"]));
        assert!(
            !publish(&registry, &["b", "a"]),
            "the same tools in another order"
        );
        assert!(registry.withdraw("s"));
        assert!(!registry.withdraw("s"));
        assert!(!publish(&registry, &[]), "no tools, as withdrawn");
        assert_eq!(registry.generation(), 2);
        assert!(changes.try_recv().is_ok());
        assert_eq!(changes.try_recv().unwrap().removed, ["s__a", "s__b"]);
        assert!(changes.try_recv().is_err());
        assert!(registry.snapshot().1.is_empty());
    }

    #[test]
    fn withdrawn_tools_stay_routable_for_calls_until_the_server_is_forgotten() {
        let registry = Registry::default();
        publish(&registry, &["a"]);
        registry.withdraw("s");
        assert!(registry.route("s__a").is_none());
        assert_eq!(registry.route_for_call("s__a").unwrap().server, "s");
        publish(&registry, &["a"]);
        assert!(registry.route("s__a").is_some());
        registry.forget("s");
        assert!(registry.route_for_call("s__a").is_none());
    }

    #[test]
    fn only_a_servers_last_withdrawn_tools_stay_routable() {
        let registry = Registry::default();
        for round in 0..100 {
            publish(&registry, &[&format!("t{round}")]);
        }
        registry.withdraw("s");
        let tables = registry.tables.read().unwrap();
        assert_eq!(tables.withdrawn.len(), 1, "not every name it ever had");
        drop(tables);
        assert_eq!(registry.route_for_call("s__t99").unwrap().server, "s");
        assert!(registry.route_for_call("s__t98").is_none());
    }
}
