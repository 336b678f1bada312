//! Prompts, resources and resource templates: what each upstream server offers, which of it
//! agents see, and where a prompt name or a resource URI goes.
//!
//! A server's offer is visible exactly while the policy has the server up: while it publishes
//! the server's tools, or, for a server with no tools to publish, while it reports the server
//! connected or healthy. So prompts and resources come and go with the tools, in the same step.
//! Prompts are named by the policy, by the rule it names the server's tools with (the
//! operator's prefix; `<server>__<prompt>` with the default policy): [`ServerCatalog::prompt_names`]
//! holds its answer, and a prompt it did not name is not shown. URIs are not rewritten (they are
//! the server's own and may be embedded in content): a table routes each URI to the server that
//! listed it. Anything two servers claim (an advertised prompt name, a URI, a URI template)
//! fails closed: it is hidden and refused, with a warning, rather than sent to a guess.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use rmcp::model::{Prompt, Resource, ResourceTemplate};
use tokio::sync::broadcast;

/// What one server offers besides tools, as it listed them, and the names its prompts get.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerCatalog {
    pub prompts: Vec<Prompt>,
    pub resources: Vec<Resource>,
    pub templates: Vec<ResourceTemplate>,
    /// The name agents see for each prompt, by its name on the server (the policy's decision).
    pub prompt_names: HashMap<String, String>,
    /// What the server tells agents about using it (its `instructions`), as its session gave
    /// them.
    pub instructions: Option<String>,
}

impl ServerCatalog {
    /// The names of the server's prompts, as it lists them (what the policy is asked to name).
    pub fn prompt_originals(&self) -> Vec<String> {
        self.prompts.iter().map(|p| p.name.to_string()).collect()
    }
}

/// Which merged lists changed (each one becomes a `list_changed` notification downstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CatalogChange {
    pub prompts: bool,
    pub resources: bool,
}

/// Where a resource URI goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UriRoute {
    /// To this server (it listed the URI, or only its templates match it).
    Server(String),
    /// Several servers claim it: refused.
    Ambiguous(Vec<String>),
    /// No visible server offers it.
    Unknown,
}

/// The merged, agent-facing view of every visible server's offer.
#[derive(Debug, Default)]
pub struct CatalogView {
    /// Advertised prompts, sorted by advertised name.
    pub prompts: Vec<Prompt>,
    prompt_routes: HashMap<String, (String, String)>,
    /// Resources, sorted by URI.
    pub resources: Vec<Resource>,
    resource_routes: HashMap<String, String>,
    /// URIs listed by more than one server, with those servers.
    contested_uris: HashMap<String, Vec<String>>,
    /// Resource templates, sorted by template.
    pub templates: Vec<ResourceTemplate>,
    template_routes: Vec<(UriTemplate, String)>,
    /// Per server, its prompts hidden because another prompt claims their advertised name.
    collided_prompts: BTreeMap<String, Vec<String>>,
}

impl CatalogView {
    /// The server and original name of an advertised prompt.
    pub fn prompt(&self, advertised: &str) -> Option<(&str, &str)> {
        self.prompt_routes
            .get(advertised)
            .map(|(server, original)| (server.as_str(), original.as_str()))
    }

    /// The server that answers for `uri`: the one that listed it, else the one whose templates
    /// match it.
    pub fn route_uri(&self, uri: &str) -> UriRoute {
        if let Some(server) = self.resource_routes.get(uri) {
            return UriRoute::Server(server.clone());
        }
        if let Some(servers) = self.contested_uris.get(uri) {
            return UriRoute::Ambiguous(servers.clone());
        }
        let owners: BTreeSet<&str> = self
            .template_routes
            .iter()
            .filter(|(template, _)| template.matches(uri))
            .map(|(_, server)| server.as_str())
            .collect();
        match owners.len() {
            0 => UriRoute::Unknown,
            1 => UriRoute::Server(owners.into_iter().next().unwrap_or_default().to_string()),
            _ => UriRoute::Ambiguous(owners.into_iter().map(str::to_string).collect()),
        }
    }

    /// `server`'s prompts hidden because their advertised name is claimed more than once.
    pub fn collided_prompts(&self, server: &str) -> &[String] {
        self.collided_prompts.get(server).map_or(&[], Vec::as_slice)
    }

    /// The server of a URI template exactly as listed (completion references name templates).
    pub fn template_owner(&self, uri_template: &str) -> Option<&str> {
        self.template_routes
            .iter()
            .find(|(template, _)| template.source == uri_template)
            .map(|(_, server)| server.as_str())
    }

    fn build(servers: &BTreeMap<String, Arc<ServerCatalog>>, visible: &BTreeSet<String>) -> Self {
        let mut view = CatalogView::default();
        let shown: Vec<(&str, &ServerCatalog)> = servers
            .iter()
            .filter(|(name, _)| visible.contains(*name))
            .map(|(name, catalog)| (name.as_str(), &**catalog))
            .collect();

        // Keyed by advertised name; a prompt the policy did not name is not shown.
        let prompts = claims(
            &shown,
            |c| &c.prompts,
            |server, prompt: &Prompt| {
                servers
                    .get(server)
                    .and_then(|c| c.prompt_names.get(&*prompt.name).cloned())
                    .unwrap_or_default()
            },
        );
        for (advertised, claims) in prompts {
            if advertised.is_empty() {
                continue;
            }
            if let [(server, prompt)] = claims[..] {
                view.prompt_routes.insert(
                    advertised.clone(),
                    (server.to_string(), prompt.name.clone()),
                );
                let mut shown = prompt.clone();
                shown.name = advertised;
                view.prompts.push(shown);
            } else {
                for (server, prompt) in &claims {
                    view.collided_prompts
                        .entry(server.to_string())
                        .or_default()
                        .push(prompt.name.to_string());
                }
                let owners: Vec<String> = claims
                    .iter()
                    .map(|(server, prompt)| format!("{server}/{}", prompt.name))
                    .collect();
                tracing::warn!(prompt = %advertised, claimed_by = ?owners, "prompt name claimed more than once; hidden");
            }
        }

        let resources = claims(&shown, |c| &c.resources, |_, r: &Resource| r.uri.clone());
        for (uri, claims) in resources {
            if let [(server, resource)] = claims[..] {
                view.resource_routes.insert(uri, server.to_string());
                view.resources.push(resource.clone());
            } else {
                let owners = owners(&claims);
                tracing::warn!(%uri, listed_by = ?owners, "resource URI listed by more than one server; refused");
                view.contested_uris.insert(uri, owners);
            }
        }

        let templates = claims(
            &shown,
            |c| &c.templates,
            |_, t: &ResourceTemplate| t.uri_template.clone(),
        );
        for (source, claims) in templates {
            if let [(server, template)] = claims[..] {
                view.template_routes
                    .push((UriTemplate::parse(&source), server.to_string()));
                view.templates.push(template.clone());
            } else {
                let owners = owners(&claims);
                tracing::warn!(template = %source, listed_by = ?owners, "resource template listed by more than one server; hidden");
            }
        }
        view
    }
}

/// The shown servers' items of one kind by key (advertised name, URI, template), with the
/// servers that claim each. A server that lists a key twice is still one claim.
fn claims<'a, T>(
    shown: &[(&'a str, &'a ServerCatalog)],
    items: impl Fn(&'a ServerCatalog) -> &'a [T],
    key: impl Fn(&str, &T) -> String,
) -> BTreeMap<String, Vec<(&'a str, &'a T)>> {
    let mut claims: BTreeMap<String, Vec<(&str, &T)>> = BTreeMap::new();
    for &(server, catalog) in shown {
        for item in items(catalog) {
            let claimants = claims.entry(key(server, item)).or_default();
            if claimants.iter().all(|(owner, _)| *owner != server) {
                claimants.push((server, item));
            }
        }
    }
    claims
}

fn owners<T>(claims: &[(&str, T)]) -> Vec<String> {
    claims
        .iter()
        .map(|(server, _)| server.to_string())
        .collect()
}

#[derive(Default)]
struct Tables {
    servers: BTreeMap<String, Arc<ServerCatalog>>,
    /// Servers whose tools the policy publishes.
    published: BTreeSet<String>,
    /// Servers the policy reports connected or healthy.
    live: BTreeSet<String>,
    view: Arc<CatalogView>,
}

impl Tables {
    fn shows(&self, server: &str) -> bool {
        self.published.contains(server) || self.live.contains(server)
    }

    fn shown(&self) -> BTreeSet<String> {
        self.published.union(&self.live).cloned().collect()
    }
}

/// Every server's offer and the merged view agents get; changes are broadcast.
pub struct Catalog {
    tables: RwLock<Tables>,
    changes: broadcast::Sender<CatalogChange>,
}

impl Default for Catalog {
    fn default() -> Self {
        Self {
            tables: RwLock::default(),
            changes: broadcast::channel(256).0,
        }
    }
}

impl Catalog {
    /// Renames `server`'s prompts (after a policy swap), keeping the rest of its offer.
    pub fn rename_prompts(&self, server: &str, names: HashMap<String, String>) {
        self.update(|tables| {
            let Some(current) = tables.servers.get(server) else {
                return false;
            };
            if current.prompt_names == names {
                return false;
            }
            let mut renamed = (**current).clone();
            renamed.prompt_names = names;
            tables.servers.insert(server.to_string(), Arc::new(renamed));
            tables.shows(server)
        });
    }

    /// What the visible servers tell agents about using them: with one server shown, its
    /// instructions as it gave them; with several, each server's under its name. `None` when
    /// none gave any.
    pub fn instructions(&self) -> Option<String> {
        let tables = self.tables.read().unwrap_or_else(|e| e.into_inner());
        let shown = tables.servers.iter().filter(|(name, _)| tables.shows(name));
        let given: Vec<(&str, &str)> = shown
            .clone()
            .filter_map(|(name, offer)| Some((name.as_str(), offer.instructions.as_deref()?)))
            .filter(|(_, text)| !text.trim().is_empty())
            .collect();
        match (given.as_slice(), shown.count()) {
            ([], _) => None,
            ([(_, only)], 1) => Some(only.to_string()),
            (several, _) => Some(
                several
                    .iter()
                    .map(|(name, text)| format!("## {name}\n\n{}", text.trim()))
                    .collect::<Vec<_>>()
                    .join("\n\n"),
            ),
        }
    }

    /// Every server's offer, for renaming its prompts.
    pub fn offers(&self) -> Vec<(String, Arc<ServerCatalog>)> {
        let tables = self.tables.read().unwrap_or_else(|e| e.into_inner());
        tables
            .servers
            .iter()
            .map(|(name, offer)| (name.clone(), offer.clone()))
            .collect()
    }

    /// Replaces what `server` offers (after a session opened or a list changed).
    pub fn set(&self, server: &str, catalog: ServerCatalog) {
        self.update(|tables| {
            let unchanged = tables
                .servers
                .get(server)
                .is_some_and(|current| **current == catalog);
            if !unchanged {
                tables.servers.insert(server.to_string(), Arc::new(catalog));
            }
            !unchanged && tables.shows(server)
        });
    }

    /// The policy published (`true`) or withdrew (`false`) `server`'s tools.
    /// Returns whether that changed anything (a server already so marked is left alone).
    pub fn set_published(&self, server: &str, published: bool) -> bool {
        self.mark(server, published, |tables| &mut tables.published)
    }

    /// The policy reported `server` connected or healthy (`true`), or anything else.
    pub fn set_live(&self, server: &str, live: bool) {
        self.mark(server, live, |tables| &mut tables.live);
    }

    /// Marks `server` in (or out of) one set; returns whether its membership changed.
    fn mark(&self, server: &str, on: bool, set: fn(&mut Tables) -> &mut BTreeSet<String>) -> bool {
        let mut changed = false;
        self.update(|tables| {
            let before = tables.shows(server);
            changed = if on {
                set(tables).insert(server.to_string())
            } else {
                set(tables).remove(server)
            };
            before != tables.shows(server) && tables.servers.contains_key(server)
        });
        changed
    }

    /// Forgets a removed server.
    pub fn forget(&self, server: &str) {
        self.update(|tables| {
            let was_shown = tables.shows(server);
            tables.published.remove(server);
            tables.live.remove(server);
            tables.servers.remove(server).is_some() && was_shown
        });
    }

    /// Whether `server`'s offer is shown.
    pub fn is_visible(&self, server: &str) -> bool {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .shows(server)
    }

    /// The merged view as it is now.
    pub fn view(&self) -> Arc<CatalogView> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .view
            .clone()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<CatalogChange> {
        self.changes.subscribe()
    }

    /// Applies `edit`; when it says the visible offer may have changed, rebuilds the view and
    /// broadcasts which merged lists differ.
    fn update(&self, edit: impl FnOnce(&mut Tables) -> bool) {
        let change = {
            let mut tables = self.tables.write().unwrap_or_else(|e| e.into_inner());
            if !edit(&mut tables) {
                return;
            }
            let view = CatalogView::build(&tables.servers, &tables.shown());
            let change = CatalogChange {
                prompts: view.prompts != tables.view.prompts,
                resources: view.resources != tables.view.resources
                    || view.templates != tables.view.templates,
            };
            tables.view = Arc::new(view);
            change
        };
        if change.prompts || change.resources {
            let _ = self.changes.send(change);
        }
    }
}

/// One page of a merged list: items from `cursor` (an offset this gateway handed out), and the
/// cursor of the next page. A cursor that is not ours is refused.
pub fn page<T: Clone>(
    items: &[T],
    cursor: Option<&str>,
    page_size: usize,
) -> Result<(Vec<T>, Option<String>), String> {
    let start = match cursor {
        None => 0,
        Some(cursor) => cursor
            .parse::<usize>()
            .ok()
            .filter(|start| *start <= items.len())
            .ok_or_else(|| {
                format!("invalid cursor {cursor:?}: it was not handed out by this list")
            })?,
    };
    let end = start.saturating_add(page_size.max(1)).min(items.len());
    let next = (end < items.len()).then(|| end.to_string());
    Ok((items[start..end].to_vec(), next))
}

/// An RFC 6570 URI template, reduced to what routing needs: its literal parts in order.
/// A simple `{var}` matches text without `/`; other expressions (`{+var}`, `{/var}`, `{?q}`,
/// ...) match anything.
#[derive(Debug, Clone)]
struct UriTemplate {
    source: String,
    parts: Vec<TemplatePart>,
}

#[derive(Debug, Clone, PartialEq)]
enum TemplatePart {
    Literal(String),
    /// A simple expansion: no `/` in its value.
    Segment,
    /// Any other expansion: anything.
    Any,
}

impl UriTemplate {
    fn parse(source: &str) -> Self {
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(TemplatePart::Literal(rest[..open].to_string()));
            }
            let Some(close) = rest[open..].find('}') else {
                // An unclosed brace is literal text.
                parts.push(TemplatePart::Literal(rest[open..].to_string()));
                rest = "";
                break;
            };
            let expression = &rest[open + 1..open + close];
            let simple = expression
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '%');
            parts.push(if simple {
                TemplatePart::Segment
            } else {
                TemplatePart::Any
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Literal(rest.to_string()));
        }
        Self {
            source: source.to_string(),
            parts,
        }
    }

    fn matches(&self, uri: &str) -> bool {
        matches_parts(&self.parts, uri)
    }
}

/// Backtracking match of template parts against `text` (templates are short: a few parts).
fn matches_parts(parts: &[TemplatePart], text: &str) -> bool {
    match parts.split_first() {
        None => text.is_empty(),
        Some((TemplatePart::Literal(literal), rest)) => text
            .strip_prefix(literal.as_str())
            .is_some_and(|after| matches_parts(rest, after)),
        Some((variable, rest)) => {
            // A variable takes a prefix of `text`; try each split (shortest first).
            let boundaries = text
                .char_indices()
                .map(|(at, _)| at)
                .chain(std::iter::once(text.len()));
            for end in boundaries {
                let value = &text[..end];
                if *variable == TemplatePart::Segment && value.contains('/') {
                    return false;
                }
                if matches_parts(rest, &text[end..]) {
                    return true;
                }
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(name: &str) -> Prompt {
        Prompt::new(name, Some("p"), None)
    }

    fn resource(uri: &str) -> Resource {
        Resource::new(uri, uri)
    }

    fn template(source: &str) -> ResourceTemplate {
        ResourceTemplate::new(source, source)
    }

    fn offer(prompts: &[&str], resources: &[&str], templates: &[&str]) -> ServerCatalog {
        ServerCatalog {
            prompts: prompts.iter().map(|p| prompt(p)).collect(),
            resources: resources.iter().map(|r| resource(r)).collect(),
            templates: templates.iter().map(|t| template(t)).collect(),
            prompt_names: HashMap::new(),
            instructions: None,
        }
    }

    /// `Catalog::set` with the prompts named as the default policy names them.
    fn set(catalog: &Catalog, server: &str, mut offer: ServerCatalog) {
        offer.prompt_names = offer
            .prompt_originals()
            .into_iter()
            .map(|p| {
                let advertised = tether_policy::naming::advertised_name(server, &p);
                (p, advertised)
            })
            .collect();
        catalog.set(server, offer);
    }

    #[test]
    fn instructions_are_the_visible_servers_and_change_no_list() {
        let catalog = Catalog::default();
        let mut changes = catalog.subscribe();
        let given = |text: &str| ServerCatalog {
            instructions: Some(text.into()),
            ..ServerCatalog::default()
        };
        catalog.set("files", given("  Read before writing.\n"));
        catalog.set("mail", given("Never send."));
        catalog.set("quiet", ServerCatalog::default());
        assert_eq!(catalog.instructions(), None, "none shown yet");
        // One server shown: its words exactly as given.
        catalog.set_live("files", true);
        assert_eq!(
            catalog.instructions().as_deref(),
            Some("  Read before writing.\n")
        );
        // Several: each under its name; a server that gave none adds nothing.
        catalog.set_published("mail", true);
        catalog.set_published("quiet", true);
        assert_eq!(
            catalog.instructions().as_deref(),
            Some("## files\n\nRead before writing.\n\n## mail\n\nNever send.")
        );
        catalog.set_live("files", false);
        catalog.set("mail", given("   "));
        assert_eq!(catalog.instructions(), None);
        assert!(changes.try_recv().is_err(), "no list changed");
    }

    #[test]
    fn an_offer_is_visible_only_while_its_server_is_published_or_live() {
        let catalog = Catalog::default();
        let mut changes = catalog.subscribe();
        set(
            &catalog,
            "files",
            offer(&["summarize"], &["file:///a"], &[]),
        );
        assert!(catalog.view().prompts.is_empty(), "not published yet");
        assert!(changes.try_recv().is_err());
        catalog.set_published("files", true);
        let view = catalog.view();
        assert_eq!(view.prompts[0].name, "files__summarize");
        assert_eq!(
            view.prompt("files__summarize"),
            Some(("files", "summarize"))
        );
        assert_eq!(
            view.route_uri("file:///a"),
            UriRoute::Server("files".into())
        );
        assert_eq!(
            changes.try_recv().unwrap(),
            CatalogChange {
                prompts: true,
                resources: true
            }
        );
        catalog.set_published("files", false);
        assert!(catalog.view().prompts.is_empty());
        assert_eq!(catalog.view().route_uri("file:///a"), UriRoute::Unknown);
        assert!(changes.try_recv().is_ok());
        // Hiding again, or setting the same offer, changes nothing.
        catalog.set_published("files", false);
        set(
            &catalog,
            "files",
            offer(&["summarize"], &["file:///a"], &[]),
        );
        assert!(changes.try_recv().is_err());
    }

    #[test]
    fn marking_a_server_as_it_is_changes_nothing_and_says_so() {
        let catalog = Catalog::default();
        set(&catalog, "files", offer(&["summarize"], &[], &[]));
        let mut changes = catalog.subscribe();
        assert!(!catalog.set_published("files", false), "never published");
        assert!(catalog.set_published("files", true));
        assert!(changes.try_recv().is_ok());
        assert!(!catalog.set_published("files", true), "already published");
        assert!(changes.try_recv().is_err());
        assert!(catalog.set_published("files", false));
        assert!(!catalog.set_published("files", false));
        assert!(changes.try_recv().is_ok());
        assert!(changes.try_recv().is_err());
    }

    #[test]
    fn only_the_lists_that_changed_are_announced() {
        let catalog = Catalog::default();
        catalog.set_published("s", true);
        let mut changes = catalog.subscribe();
        set(&catalog, "s", offer(&["a"], &[], &[]));
        assert_eq!(
            changes.try_recv().unwrap(),
            CatalogChange {
                prompts: true,
                resources: false
            }
        );
        set(&catalog, "s", offer(&["a"], &["x://1"], &[]));
        assert_eq!(
            changes.try_recv().unwrap(),
            CatalogChange {
                prompts: false,
                resources: true
            }
        );
        // A server without tools is shown while the policy reports it live.
        set(&catalog, "docs-only", offer(&["howto"], &[], &[]));
        assert!(changes.try_recv().is_err(), "not live yet");
        catalog.set_live("docs-only", true);
        assert!(changes.try_recv().unwrap().prompts);
        assert!(catalog.view().prompt("docs-only__howto").is_some());
        catalog.set_published("docs-only", true);
        catalog.set_live("docs-only", false);
        assert!(changes.try_recv().is_err(), "still published");
        catalog.set_published("docs-only", false);
        assert!(changes.try_recv().unwrap().prompts);
        assert!(catalog.view().prompt("docs-only__howto").is_none());
        // A server with nothing besides tools announces nothing when it comes and goes.
        catalog.set_published("tools-only", true);
        set(&catalog, "tools-only", ServerCatalog::default());
        catalog.set_published("tools-only", false);
        assert!(changes.try_recv().is_err());
    }

    #[test]
    fn what_two_servers_claim_fails_closed() {
        let catalog = Catalog::default();
        set(
            &catalog,
            "a",
            offer(&["p"], &["shared://x", "a://only"], &["t://{id}"]),
        );
        set(&catalog, "b", offer(&["q"], &["shared://x"], &["t://{id}"]));
        // Different names that sanitise to the same advertised name.
        set(&catalog, "a.b", offer(&["c"], &[], &[]));
        set(&catalog, "a_b", offer(&["c"], &[], &[]));
        for server in ["a", "b", "a.b", "a_b"] {
            catalog.set_published(server, true);
        }
        let view = catalog.view();
        let names: Vec<&str> = view.prompts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a__p", "b__q"]);
        assert!(view.prompt("a_b__c").is_none());
        assert_eq!(
            view.route_uri("shared://x"),
            UriRoute::Ambiguous(vec!["a".into(), "b".into()])
        );
        assert_eq!(view.route_uri("a://only"), UriRoute::Server("a".into()));
        assert!(view.resources.iter().all(|r| r.uri != "shared://x"));
        assert!(view.templates.is_empty(), "a template both list is hidden");
        assert_eq!(view.route_uri("t://7"), UriRoute::Unknown);
    }

    #[test]
    fn uris_route_through_templates_when_no_server_listed_them() {
        let catalog = Catalog::default();
        set(
            &catalog,
            "notes",
            offer(&[], &[], &["notes://{id}", "notes://{id}/raw"]),
        );
        set(&catalog, "files", offer(&[], &[], &["file:///{+path}"]));
        catalog.set_published("notes", true);
        catalog.set_published("files", true);
        let view = catalog.view();
        assert_eq!(
            view.route_uri("notes://12"),
            UriRoute::Server("notes".into())
        );
        assert_eq!(
            view.route_uri("notes://12/raw"),
            UriRoute::Server("notes".into())
        );
        assert_eq!(
            view.route_uri("file:///etc/hosts"),
            UriRoute::Server("files".into())
        );
        assert_eq!(view.route_uri("other://x"), UriRoute::Unknown);
        assert_eq!(view.template_owner("notes://{id}"), Some("notes"));
        assert_eq!(view.template_owner("notes://{other}"), None);
    }

    #[test]
    fn templates_match_literals_in_order() {
        let t = UriTemplate::parse("db://{table}/rows{?limit,offset}");
        assert!(t.matches("db://users/rows"));
        assert!(t.matches("db://users/rows?limit=3"));
        assert!(
            !t.matches("db://a/b/rows"),
            "a simple variable holds no slash"
        );
        assert!(!t.matches("dbx://users/rows"));
        let t = UriTemplate::parse("plain://fixed");
        assert!(t.matches("plain://fixed"));
        assert!(!t.matches("plain://fixed/more"));
        let t = UriTemplate::parse("broken://{x");
        assert!(t.matches("broken://{x"));
    }

    #[test]
    fn pages_follow_cursors_and_refuse_foreign_ones() {
        let items: Vec<u32> = (0..5).collect();
        let (first, next) = page(&items, None, 2).unwrap();
        assert_eq!((first, next.as_deref()), (vec![0, 1], Some("2")));
        let (last, next) = page(&items, Some("4"), 2).unwrap();
        assert_eq!((last, next), (vec![4], None));
        assert!(page(&items, Some("9"), 2).is_err());
        assert!(page(&items, Some("abc"), 2).is_err());
        assert_eq!(page::<u32>(&[], None, 2).unwrap(), (vec![], None));
    }
}
