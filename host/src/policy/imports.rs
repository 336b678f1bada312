//! What a component imports, read from its bytes before it is compiled: a component that needs
//! something the policy sandbox does not offer (`wasi:http`, WASI 0.3, another world's
//! interfaces) is refused in milliseconds, naming what it imports, instead of after a compile
//! that takes seconds (tens of seconds for a Python or JavaScript component).

use wasmparser::{Chunk, Encoding, Parser, Payload};

/// The WASI 0.2 packages the sandbox links (`wasmtime_wasi::p2::add_to_linker_sync`). They are
/// linked so that components built by ordinary toolchains load; what the sandbox's context
/// gives through them is clocks, randomness and stdio (to the log): no environment variables,
/// no preopened directories, no network, so file and socket calls fail at run time.
const OFFERED_WASI: [&str; 6] = [
    "wasi:cli",
    "wasi:clocks",
    "wasi:filesystem",
    "wasi:io",
    "wasi:random",
    "wasi:sockets",
];

/// The contract's own package (the `log` interface a policy may import).
const CONTRACT: &str = "tether:policy";

/// The names a component imports at its top level (`wasi:cli/environment@0.2.3`, …). Nested
/// modules and components are skipped: only the top level is linked.
pub(crate) fn top_level_imports(bytes: &[u8]) -> Result<Vec<String>, String> {
    let mut parser = Parser::new(0);
    let mut data = bytes;
    let mut names = Vec::new();
    loop {
        let (consumed, payload) = match parser.parse(data, true).map_err(|e| e.to_string())? {
            Chunk::Parsed { consumed, payload } => (consumed, payload),
            Chunk::NeedMoreData(_) => return Err("the file is truncated".into()),
        };
        data = &data[consumed..];
        match payload {
            Payload::Version {
                encoding: Encoding::Module,
                ..
            } => return Err("a core wasm module, not a component".into()),
            Payload::ComponentImportSection(section) => {
                for import in section {
                    names.push(import.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            Payload::ModuleSection {
                unchecked_range, ..
            }
            | Payload::ComponentSection {
                unchecked_range, ..
            } => {
                data = data
                    .get(unchecked_range.len()..)
                    .ok_or("the file is truncated")?;
            }
            Payload::End(_) => return Ok(names),
            _ => {}
        }
    }
}

/// Whether the sandbox offers the import `name`.
pub(crate) fn offered(name: &str) -> bool {
    let (package, rest) = name.split_once('/').unwrap_or((name, ""));
    if package == CONTRACT {
        return true;
    }
    let version = rest.split_once('@').map_or("", |(_, version)| version);
    OFFERED_WASI.contains(&package) && version.starts_with("0.2.")
}

/// Why a component cannot be linked, if its imports say so. Bytes that do not parse are left
/// to the compiler, which says what is wrong with them.
pub(crate) fn refusal(bytes: &[u8]) -> Option<String> {
    let imports = top_level_imports(bytes).ok()?;
    let missing: Vec<&str> = imports
        .iter()
        .map(String::as_str)
        .filter(|name| !offered(name))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let mut why = format!(
        "it imports {}, which the policy sandbox does not link (it links WASI 0.2's {}, and \
         gives no files, network or environment through them)",
        missing.join(", "),
        OFFERED_WASI.join(", ")
    );
    if missing.iter().any(|name| name.starts_with("wasi:http/")) {
        why.push_str(
            "; a componentize-js build imports wasi:http unless built with \
             `--disable http --disable fetch-event`",
        );
    }
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_policy_needs_only_what_the_sandbox_offers() {
        let imports = top_level_imports(crate::policy::EMBEDDED_DEFAULT_POLICY).unwrap();
        assert!(!imports.is_empty());
        assert!(imports.iter().all(|name| offered(name)), "{imports:?}");
        assert_eq!(refusal(crate::policy::EMBEDDED_DEFAULT_POLICY), None);
    }

    #[test]
    fn wasi_0_2_and_the_contract_are_offered_and_nothing_else() {
        assert!(offered("wasi:cli/environment@0.2.3"));
        assert!(offered("wasi:io/streams@0.2.0"));
        assert!(offered("tether:policy/types@0.2.0"));
        assert!(!offered("wasi:http/types@0.2.3"));
        assert!(!offered("wasi:cli/environment@0.3.0"));
        assert!(!offered("wasi:keyvalue/store@0.2.0"));
        assert!(!offered("my:own/thing"));
    }

    #[test]
    fn what_does_not_parse_as_a_component_is_left_to_the_compiler() {
        let module = b"\0asm\x01\0\0\0";
        assert!(
            top_level_imports(module)
                .unwrap_err()
                .contains("core wasm module")
        );
        assert_eq!(refusal(module), None);
        assert_eq!(refusal(b"not wasm at all"), None);
    }

    /// A component importing `wasi:http/types`, as componentize-js makes by default.
    fn importing_wasi_http() -> Vec<u8> {
        use wasm_encoder::{
            Component, ComponentImportSection, ComponentTypeRef, ComponentTypeSection, InstanceType,
        };
        let mut types = ComponentTypeSection::new();
        types.instance(&InstanceType::new());
        let mut imports = ComponentImportSection::new();
        imports.import("wasi:cli/environment@0.2.3", ComponentTypeRef::Instance(0));
        imports.import("wasi:http/types@0.2.3", ComponentTypeRef::Instance(0));
        let mut component = Component::new();
        component.section(&types).section(&imports);
        component.finish()
    }

    #[test]
    fn an_import_the_sandbox_lacks_is_named_before_anything_compiles() {
        let bytes = importing_wasi_http();
        assert_eq!(
            top_level_imports(&bytes).unwrap(),
            ["wasi:cli/environment@0.2.3", "wasi:http/types@0.2.3"]
        );
        let why = refusal(&bytes).unwrap();
        assert!(
            why.starts_with("it imports wasi:http/types@0.2.3, which"),
            "{why}"
        );
        assert!(
            why.contains("--disable http --disable fetch-event"),
            "{why}"
        );

        let engine = crate::policy::PolicyEngine::new(None).unwrap();
        let error = engine
            .load(&crate::policy::PolicySource::Bytes {
                label: "http.wasm".into(),
                bytes,
            })
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("http.wasm") && error.contains("wasi:http/types@0.2.3"),
            "{error}"
        );
        assert_eq!(engine.compilations(), 0, "refused before compiling");
    }
}
