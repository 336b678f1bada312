//! Advertised tool and prompt names: `<prefix><name>`, where the prefix is the operator's
//! (`""` for the server's own names) or, by default, `<server>__`; sanitised to `[A-Za-z0-9_-]`,
//! at most 64 chars.

use std::hash::Hasher;

use fnv::FnvHasher;

/// Longest name agents may see (MCP clients commonly reject longer tool names).
pub const MAX_ADVERTISED_LEN: usize = 64;

/// Length of the hash suffix appended to clamped names.
const HASH_HEX_LEN: usize = 8;

/// FNV-1a 64 over the concatenated parts: stable across runs, platforms and versions
/// (unlike `std`'s hashers, which are randomly keyed or unspecified).
pub fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut hasher = FnvHasher::default();
    for part in parts {
        hasher.write(part);
    }
    hasher.finish()
}

/// Replaces every char outside `[A-Za-z0-9_-]` with `_` (one `_` per char, not per byte).
pub fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The name agents see for `tool` of `server`.
///
/// Names longer than 64 chars keep a prefix and end in `_` + 8 hex chars of a hash of the
/// unsanitised `server\0tool`, so two long names that share a prefix still differ.
pub fn advertised_name(server: &str, tool: &str) -> String {
    advertised_name_with(None, server, tool)
}

/// The name agents see for `name` (a tool or a prompt) of `server`, with the operator's
/// `prefix` before it (`None`: `<server>__`). The clamp's hash is over `server\0name` whatever
/// the prefix, so the default names are those of [`advertised_name`].
pub fn advertised_name_with(prefix: Option<&str>, server: &str, tool: &str) -> String {
    let full = match prefix {
        Some(prefix) => sanitize(&format!("{prefix}{tool}")),
        None => sanitize(&format!("{server}__{tool}")),
    };
    // Too long, or empty (prefix "" and a name ""): the hash makes it a usable name.
    if (1..=MAX_ADVERTISED_LEN).contains(&full.len()) {
        return full;
    }
    let hash = fnv64(&[server.as_bytes(), b"\0", tool.as_bytes()]);
    // Fold the 64-bit hash into 32 bits so every input bit counts.
    let folded = (hash >> 32) ^ (hash & 0xffff_ffff);
    let keep = MAX_ADVERTISED_LEN - HASH_HEX_LEN - 1;
    // `full` is ASCII after sanitising, so byte slicing is char slicing.
    format!("{}_{:08x}", &full[..keep.min(full.len())], folded)
}

/// The names agents see for a server's prompts (`originals`), by the rule of its tools;
/// prompts that would share a name are all withheld, as tools are.
pub fn prompt_names(
    prefix: Option<&str>,
    server: &str,
    originals: &[String],
) -> Vec<crate::model::NamedPrompt> {
    let mut by_name: std::collections::BTreeMap<String, Vec<&String>> = Default::default();
    for original in originals {
        by_name
            .entry(advertised_name_with(prefix, server, original))
            .or_default()
            .push(original);
    }
    by_name
        .into_iter()
        .filter_map(|(advertised, group)| match group.as_slice() {
            [original] => Some(crate::model::NamedPrompt {
                advertised,
                original: (*original).clone(),
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= MAX_ADVERTISED_LEN
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn short_names_join_server_and_tool_with_double_underscore() {
        assert_eq!(advertised_name("files", "read_file"), "files__read_file");
        assert_eq!(advertised_name("my-srv", "get-x"), "my-srv__get-x");
    }

    #[test]
    fn disallowed_chars_become_underscores_one_per_char() {
        assert_eq!(advertised_name("a.b", "c d/é"), "a_b__c_d__");
        assert_eq!(sanitize("üñï"), "___");
    }

    #[test]
    fn long_names_are_clamped_to_exactly_64_chars_with_a_stable_hash_suffix() {
        let tool = "t".repeat(100);
        let name = advertised_name("server", &tool);
        assert_eq!(name.len(), 64);
        assert!(valid(&name));
        assert!(name.starts_with("server__ttt"));
        // Pinned: the suffix must not change across runs or versions.
        assert_eq!(name, advertised_name("server", &tool));
        let suffix = &name[55..];
        assert!(suffix.starts_with('_'));
        assert!(
            suffix[1..]
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        );
        let hash = fnv64(&[b"server", b"\0", tool.as_bytes()]);
        assert_eq!(
            &suffix[1..],
            format!("{:08x}", (hash >> 32) ^ (hash & 0xffff_ffff))
        );
    }

    #[test]
    fn fnv64_matches_the_reference_vectors() {
        // FNV-1a 64 test vectors from the reference implementation.
        assert_eq!(fnv64(&[b""]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv64(&[b"foo", b"bar"]), fnv64(&[b"foobar"]));
    }

    #[test]
    fn clamped_names_with_a_shared_prefix_differ() {
        let a = advertised_name("server", &format!("{}a", "x".repeat(80)));
        let b = advertised_name("server", &format!("{}b", "x".repeat(80)));
        assert_ne!(a, b);
        assert_eq!(a[..55], b[..55]);
    }

    #[test]
    fn hash_is_over_the_unsanitised_names() {
        let a = advertised_name("s", &format!("{}.", "x".repeat(80)));
        let b = advertised_name("s", &format!("{}/", "x".repeat(80)));
        assert_ne!(a, b);
    }

    #[test]
    fn an_operator_prefix_replaces_the_server_name_and_is_sanitised_like_the_rest() {
        assert_eq!(
            advertised_name_with(Some(""), "files", "read_file"),
            "read_file"
        );
        assert_eq!(
            advertised_name_with(Some("fs."), "files", "read"),
            "fs_read"
        );
        assert_eq!(advertised_name_with(Some("x-"), "files", "a b"), "x-a_b");
        assert_eq!(
            advertised_name_with(None, "files", "read"),
            advertised_name("files", "read")
        );
        let long = "t".repeat(100);
        let name = advertised_name_with(Some(""), "files", &long);
        assert_eq!(name.len(), 64);
        assert!(valid(&name));
        // Clamped names of two servers differ even without a prefix.
        assert_ne!(name, advertised_name_with(Some(""), "other", &long));
        // An empty name with an empty prefix still gives a usable name.
        let empty = advertised_name_with(Some(""), "files", "");
        assert!(valid(&empty), "{empty:?}");
    }

    #[test]
    fn exactly_64_chars_is_not_clamped() {
        let tool = "t".repeat(64 - "srv__".len());
        let name = advertised_name("srv", &tool);
        assert_eq!(name, format!("srv__{tool}"));
    }
}
