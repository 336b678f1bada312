//! `tether policy check` and `tether policy replay`: a policy component run here, not in a
//! gateway.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use tether::policy::{PolicySource, conformance};

use crate::args::CheckArgs;

pub fn check(args: CheckArgs) -> ExitCode {
    if let Some(dir) = &args.export {
        return match conformance::export(dir) {
            Ok(()) => {
                eprintln!(
                    "wrote {} scenarios into {}",
                    conformance::scenarios().len(),
                    dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("error: cannot write into {}: {error}", dir.display());
                ExitCode::from(2)
            }
        };
    }
    let cache_dir = match args.no_cache {
        true => None,
        false => args.cache_dir.or_else(crate::default_cache_dir),
    };
    let (file, settings, json) = (args.file, args.settings.as_str(), args.json);
    let source = file.map_or(PolicySource::Embedded, PolicySource::File);
    let started = Instant::now();
    // Loading errors (not a component, an import the sandbox lacks, incompatible version) and
    // settings the policy refuses are reported once, not per scenario.
    let engine = match tether::policy::PolicyEngine::new(cache_dir.clone())
        .map_err(|error| error.to_string())
        .and_then(|engine| conformance::preflight(&engine, &source, settings).map(|()| engine))
    {
        Ok(engine) => engine,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(crate::exit::CONFIG);
        }
    };
    let loaded = started.elapsed().as_secs_f64();
    match (engine.compilations(), &cache_dir, &source) {
        (0, _, PolicySource::Embedded) => {
            eprintln!("loaded in {loaded:.2} s (the embedded policy comes compiled)")
        }
        (0, _, _) => eprintln!("loaded without compiling in {loaded:.2} s (from the cache)"),
        (_, Some(dir), _) => eprintln!(
            "compiled in {loaded:.2} s (kept in {} for the next check)",
            dir.display()
        ),
        (_, None, _) => eprintln!("compiled in {loaded:.2} s (not kept: --no-cache)"),
    }
    let results = conformance::run(&engine, &source, settings);
    if let Some(dir) = &args.transcripts
        && let Err(error) = conformance::write_transcripts(dir, &results)
    {
        eprintln!("error: cannot write into {}: {error}", dir.display());
        return ExitCode::from(2);
    }
    let failed = results.iter().filter(|r| r.failure.is_some()).count();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&results).expect("results serialize")
        );
    } else {
        println!("checking {}", source.label());
        for (level, title) in [
            (
                conformance::Level::Contract,
                "the contract (any policy must)",
            ),
            (
                conformance::Level::Invariant,
                "Tether's invariants (a policy may break them on purpose)",
            ),
        ] {
            println!("{title}:");
            let mut passed = 0;
            let mut failed = 0;
            for result in results.iter().filter(|r| r.level == level) {
                match &result.failure {
                    None if !result.applicable => {
                        passed += 1;
                        println!(
                            "  n/a   {} (the policy predates what it checks)",
                            result.name
                        )
                    }
                    None => {
                        passed += 1;
                        println!("  ok    {}", result.name)
                    }
                    Some(why) => {
                        failed += 1;
                        println!("  FAIL  {}: {why}", result.name)
                    }
                }
            }
            println!("  {passed} passed, {failed} failed");
        }
        println!("{} passed, {failed} failed", results.len() - failed);
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

pub fn replay(
    recording: &Path,
    candidate: Option<PathBuf>,
    settings: Option<String>,
    json: bool,
) -> ExitCode {
    use tether::policy::record;
    use tether::policy::replay::{ReplayError, replay};
    let records = match record::read(recording) {
        Ok(records) => records,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let source = candidate.map_or(PolicySource::Embedded, PolicySource::File);
    let report = match replay(&records, source.clone(), settings) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(match error {
                ReplayError::Start(_) => crate::exit::CONFIG,
                _ => 2,
            });
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serializes")
        );
    } else {
        println!(
            "replayed {} decisions of {} against {}: {} differ",
            report.decisions,
            recording.display(),
            source.label(),
            report.divergences
        );
        if report.policy_changes > 0 {
            println!(
                "note: the recording changes policy {} times (swaps or fallbacks); it is compared as recorded",
                report.policy_changes
            );
        }
        for (kind, count) in &report.by_kind {
            println!("  {count:>6}  {kind}");
        }
        for divergence in report.first_per_server.values() {
            println!(
                "first on {} (line {}, {}):\n    recorded:  {}\n    candidate: {}",
                divergence.server,
                divergence.line,
                divergence.kind,
                divergence.recorded,
                divergence.candidate
            );
        }
    }
    if report.divergences == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
