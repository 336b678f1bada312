//! What a soak found: the calls and how they ended, the executions recorded by the fixtures,
//! the state after things settled, the shutdown and the gateway's memory. [`Report::failures`]
//! lists every broken invariant; [`Report::print`] prints the tables.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use super::clients::{CallRecord, Outcome, ToolKind};
use super::schedule::Transport;

/// Where (and as what) a call was executed, from a fixture's `calls.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub server: String,
    pub tool: ToolKind,
}

/// Calls as the fixtures saw them, checked against the calls as the agents saw them.
#[derive(Debug, Default)]
pub struct Executions {
    /// Executions recorded in every `calls.log`.
    pub total: usize,
    /// Calls of a tool that is not read-only that ran more than once: (id, times).
    pub duplicates: Vec<(u64, usize)>,
    /// Read-only calls that ran twice (Tether retries those once on a fresh session).
    pub read_only_retried: usize,
    /// Read-only calls that ran more than twice.
    pub read_only_excess: Vec<(u64, usize)>,
    /// Answered ok, yet never executed.
    pub ok_not_executed: Vec<u64>,
    /// Refused with "the call was not sent" (or as an unknown tool), yet executed.
    pub refused_but_executed: Vec<u64>,
    /// Executed on another server, or as another tool, than the one called.
    pub misrouted: Vec<u64>,
    /// Executions that name no call the agents made.
    pub unattributed: Vec<String>,
}

impl Executions {
    /// Matches every `calls.log` line (`logs`: server name, file text) with the agents' calls.
    pub fn check(records: &[CallRecord], logs: &[(String, String)]) -> Executions {
        let mut out = Executions::default();
        let mut runs: HashMap<u64, Vec<Execution>> = HashMap::new();
        for (server, log) in logs {
            for line in log.lines().filter(|l| !l.trim().is_empty()) {
                out.total += 1;
                let parsed = line.split_once(' ').and_then(|(tool, arguments)| {
                    let tool = ToolKind::from_name(tool)?;
                    let arguments: serde_json::Value = serde_json::from_str(arguments).ok()?;
                    Some((tool, tool.id_in(&arguments)?))
                });
                match parsed {
                    Some((tool, id)) => runs.entry(id).or_default().push(Execution {
                        server: server.clone(),
                        tool,
                    }),
                    None => out.unattributed.push(format!("{server}: {line}")),
                }
            }
        }
        let mut known = std::collections::HashSet::new();
        for record in records {
            known.insert(record.id);
            let ran = runs.get(&record.id).map_or(&[][..], Vec::as_slice);
            if ran
                .iter()
                .any(|e| e.server != record.server || e.tool != record.tool)
            {
                out.misrouted.push(record.id);
            }
            let times = ran.len();
            if record.tool.read_only() {
                match times {
                    0 | 1 => {}
                    2 => out.read_only_retried += 1,
                    _ => out.read_only_excess.push((record.id, times)),
                }
            } else if times > 1 {
                out.duplicates.push((record.id, times));
            }
            match record.outcome {
                Outcome::Ok if times == 0 => out.ok_not_executed.push(record.id),
                Outcome::NotSent(_) | Outcome::UnknownTool if times > 0 => {
                    out.refused_but_executed.push(record.id)
                }
                _ => {}
            }
        }
        let mut strays: Vec<u64> = runs
            .keys()
            .filter(|id| !known.contains(id))
            .copied()
            .collect();
        strays.sort_unstable();
        for id in strays {
            out.unattributed
                .push(format!("call id {id}, which no agent made"));
        }
        out
    }
}

/// The state once chaos stopped and every fixture was made healthy.
#[derive(Debug, Default)]
pub struct Settle {
    pub within: Duration,
    /// When every server was live with exactly its tools listed, twice in a row.
    pub settled_after: Option<Duration>,
    pub servers: usize,
    /// From the last observation: servers without a live session ("name (state)").
    pub not_live: Vec<String>,
    /// Listed tools of servers without a live session (before and after the listing).
    pub phantoms: Vec<String>,
    /// Tools of live servers (before and after the listing) that were not listed.
    pub missing: Vec<String>,
    /// stdio servers whose reported pid is not their live fixture process.
    pub pid_mismatch: Vec<String>,
    /// Phantom tools seen while things were still settling (a tool listed while its server was
    /// reported without a session just before and just after); not counted as a failure.
    pub transient_phantoms: usize,
    /// Servers whose `echo` answered through the gateway after settling.
    pub verified: usize,
    pub unverified: Vec<String>,
    pub errors: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Shutdown {
    pub exited: bool,
    pub exit_code: Option<i32>,
    pub took: Duration,
    /// Fixture processes (of Tether's stdio servers) alive after the gateway exited.
    pub leftovers: Vec<(u32, String)>,
    /// Calls running in their fixture when SIGTERM came: server, the outcome it must have
    /// (ok for a slow call, which the drain waits for; timed out for a hung one), the outcome.
    pub in_flight: Vec<(String, Outcome, Outcome)>,
}

impl Shutdown {
    pub fn in_flight_wrong(&self) -> Vec<String> {
        self.in_flight
            .iter()
            .filter(|(_, want, got)| want != got)
            .map(|(server, want, got)| format!("{server}: {got:?}, not {want:?}"))
            .collect()
    }
}

#[derive(Debug, Default)]
pub struct Memory {
    pub rss_ready_kib: u64,
    pub rss_max_kib: u64,
    pub hwm_kib: u64,
    pub limit_kib: u64,
    pub fds_ready: usize,
    pub fds_end: usize,
}

#[derive(Debug, Default)]
pub struct Chaos {
    pub events: usize,
    /// Faults applied, by kind.
    pub applied: BTreeMap<&'static str, usize>,
    /// Kills of stdio servers that found no process (it was already down).
    pub kills_missed: usize,
    /// Operator reconnects the gateway refused.
    pub reconnects_refused: usize,
    /// Fixture process starts by transport (every restart counts).
    pub starts: BTreeMap<Transport, u64>,
    /// HTTP fixture restarts that could not bind the port again at once (retried).
    pub http_rebind_retries: u64,
}

#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub seconds: f64,
    pub servers: Vec<(String, Transport)>,
    pub clients: usize,
    pub lanes: usize,
    /// The longest a call may take by Tether's configured deadlines.
    pub deadline: Duration,
    /// `deadline` plus the margin allowed for a loaded machine.
    pub bound: Duration,
    pub records: Vec<CallRecord>,
    pub list_failures: Vec<String>,
    pub executions: Executions,
    pub chaos: Chaos,
    pub settle: Settle,
    pub shutdown: Shutdown,
    pub memory: Memory,
    pub took: Duration,
}

fn ids(list: &[u64]) -> String {
    let shown: Vec<String> = list.iter().take(10).map(u64::to_string).collect();
    let more = if list.len() > 10 { ", ..." } else { "" };
    format!("{}{more}", shown.join(", "))
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn kib(k: u64) -> String {
    format!("{:.1} MiB", k as f64 / 1024.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

impl Report {
    fn transport_of(&self, server: &str) -> Option<Transport> {
        self.servers
            .iter()
            .find(|(name, _)| name == server)
            .map(|(_, t)| *t)
    }

    /// Calls that ended after `bound` (other than hung ones, counted apart).
    pub fn late(&self) -> Vec<&CallRecord> {
        self.records
            .iter()
            .filter(|r| r.outcome != Outcome::Hung && r.latency > self.bound)
            .collect()
    }

    pub fn count(&self, what: impl Fn(&Outcome) -> bool) -> usize {
        self.records.iter().filter(|r| what(&r.outcome)).count()
    }

    /// Every broken invariant, in words; empty when the soak passed.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut add = |ok: bool, message: String| {
            if !ok {
                out.push(message);
            }
        };
        add(!self.records.is_empty(), "no call was made".into());
        add(
            self.count(|o| *o == Outcome::Ok) > 0,
            "no call was answered ok".into(),
        );
        let examples = |pick: &dyn Fn(&Outcome) -> bool| -> String {
            self.records
                .iter()
                .filter(|r| pick(&r.outcome))
                .take(3)
                .map(|r| format!("#{} {}__{} {:?}", r.id, r.server, r.tool.name(), r.outcome))
                .collect::<Vec<_>>()
                .join("; ")
        };
        for (what, pick) in [
            (
                "hung (no answer within the client's patience)",
                &(|o: &Outcome| *o == Outcome::Hung) as &dyn Fn(&Outcome) -> bool,
            ),
            ("answered with an unclear message", &|o| {
                matches!(o, Outcome::Unclear(_))
            }),
            ("answered ok with a wrong answer", &|o| {
                matches!(o, Outcome::WrongAnswer(_))
            }),
            ("failed with an MCP error from the gateway", &|o| {
                matches!(o, Outcome::ClientError(_))
            }),
        ] {
            let n = self.count(pick);
            add(n == 0, format!("{n} calls {what}: {}", examples(pick)));
        }
        let late = self.late();
        add(
            late.is_empty(),
            format!(
                "{} calls ended after their deadline + margin ({}): {}",
                late.len(),
                ms(self.bound),
                late.iter()
                    .take(3)
                    .map(|r| format!("#{} {} in {}", r.id, r.server, ms(r.latency)))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        );
        add(
            self.list_failures.is_empty(),
            format!(
                "{} tools/list requests failed: {}",
                self.list_failures.len(),
                self.list_failures.first().cloned().unwrap_or_default()
            ),
        );
        let e = &self.executions;
        add(
            e.duplicates.is_empty(),
            format!(
                "{} calls of a tool that is not read-only ran more than once: ids {}",
                e.duplicates.len(),
                ids(&e.duplicates.iter().map(|d| d.0).collect::<Vec<_>>())
            ),
        );
        add(
            e.read_only_excess.is_empty(),
            format!(
                "{} read-only calls ran more than twice: ids {}",
                e.read_only_excess.len(),
                ids(&e.read_only_excess.iter().map(|d| d.0).collect::<Vec<_>>())
            ),
        );
        add(
            e.ok_not_executed.is_empty(),
            format!(
                "{} calls answered ok never ran: ids {}",
                e.ok_not_executed.len(),
                ids(&e.ok_not_executed)
            ),
        );
        add(
            e.refused_but_executed.is_empty(),
            format!(
                "{} calls refused as not sent ran anyway: ids {}",
                e.refused_but_executed.len(),
                ids(&e.refused_but_executed)
            ),
        );
        add(
            e.misrouted.is_empty(),
            format!(
                "{} calls ran on another server or tool: ids {}",
                e.misrouted.len(),
                ids(&e.misrouted)
            ),
        );
        add(
            e.unattributed.is_empty(),
            format!(
                "{} executions name no call: {}",
                e.unattributed.len(),
                e.unattributed
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        );
        let s = &self.settle;
        add(
            s.settled_after.is_some(),
            format!(
                "not settled within {}: servers without a live session: [{}]; phantom tools: [{}]; missing tools: [{}]; errors: [{}]",
                ms(s.within),
                s.not_live.join(", "),
                s.phantoms.join(", "),
                s.missing.join(", "),
                s.errors.join("; ")
            ),
        );
        add(
            s.phantoms.is_empty(),
            format!(
                "tools listed for servers without a live session after settling: {}",
                s.phantoms.join(", ")
            ),
        );
        add(
            s.pid_mismatch.is_empty(),
            format!(
                "stdio servers whose reported pid is not their live process: {}",
                s.pid_mismatch.join(", ")
            ),
        );
        add(
            s.unverified.is_empty(),
            format!(
                "servers whose tools did not answer after settling: {}",
                s.unverified.join(", ")
            ),
        );
        let d = &self.shutdown;
        add(
            d.exited && d.exit_code == Some(0),
            format!(
                "the gateway did not exit cleanly on SIGTERM (exited: {}, code {:?}, after {})",
                d.exited,
                d.exit_code,
                ms(d.took)
            ),
        );
        let wrong = d.in_flight_wrong();
        add(
            wrong.is_empty(),
            format!(
                "calls in flight at SIGTERM were not answered as they should be: {}",
                wrong.join("; ")
            ),
        );
        add(
            d.leftovers.is_empty(),
            format!(
                "{} fixture processes left after the gateway exited: {:?}",
                d.leftovers.len(),
                d.leftovers
            ),
        );
        let m = &self.memory;
        add(
            m.hwm_kib <= m.limit_kib,
            format!(
                "the gateway's peak RSS {} is over the limit {}",
                kib(m.hwm_kib),
                kib(m.limit_kib)
            ),
        );
        out
    }

    /// The report as text (tables in Markdown).
    pub fn render(&self) -> String {
        let mut o = String::new();
        let stdio = self
            .servers
            .iter()
            .filter(|s| s.1 == Transport::Stdio)
            .count();
        let http = self
            .servers
            .iter()
            .filter(|s| s.1 == Transport::Http)
            .count();
        let sse = self
            .servers
            .iter()
            .filter(|s| s.1 == Transport::Sse)
            .count();
        let _ = writeln!(
            o,
            "chaos soak: seed {}, {:.0} s of chaos, {} servers ({stdio} stdio, {http} Streamable HTTP, {sse} legacy SSE), {} clients x {} lanes; whole run {:.1} s\n",
            self.seed,
            self.seconds,
            self.servers.len(),
            self.clients,
            self.lanes,
            self.took.as_secs_f64()
        );

        // Outcomes by transport.
        let mut rows: BTreeMap<(bool, &'static str), [usize; 4]> = BTreeMap::new();
        for record in &self.records {
            let column = match self.transport_of(&record.server) {
                Some(Transport::Stdio) => 0,
                Some(Transport::Http) => 1,
                Some(Transport::Sse) => 2,
                None => 3,
            };
            let row = rows
                .entry((record.outcome.is_failure(), record.outcome.row()))
                .or_default();
            row[column] += 1;
            row[3] += usize::from(column != 3);
        }
        let mut table = vec![vec![
            "calls".to_string(),
            "stdio".into(),
            "http".into(),
            "sse".into(),
            "all".into(),
        ]];
        let mut totals = [0usize; 4];
        for ((_, name), counts) in &rows {
            for (t, c) in totals.iter_mut().zip(counts) {
                *t += c;
            }
            let mut row = vec![name.to_string()];
            row.extend(counts.iter().map(usize::to_string));
            table.push(row);
        }
        let mut total_row = vec!["total".to_string()];
        total_row.extend(totals.iter().map(usize::to_string));
        table.push(total_row);
        markdown(&mut o, &table);

        // Latency.
        let mut all: Vec<Duration> = self.records.iter().map(|r| r.latency).collect();
        all.sort_unstable();
        let max_of = |pick: &dyn Fn(&Outcome) -> bool| {
            self.records
                .iter()
                .filter(|r| pick(&r.outcome))
                .map(|r| r.latency)
                .max()
                .map_or("-".to_string(), ms)
        };
        let table = vec![
            vec!["latency".to_string(), "value".into()],
            vec![
                "p50 / p99 (all calls)".into(),
                format!(
                    "{} / {}",
                    ms(percentile(&all, 0.5)),
                    ms(percentile(&all, 0.99))
                ),
            ],
            vec!["max, answered ok".into(), max_of(&|o| *o == Outcome::Ok)],
            vec![
                "max, refused (not sent)".into(),
                max_of(&|o| matches!(o, Outcome::NotSent(_))),
            ],
            vec![
                "max, timed out".into(),
                max_of(&|o| *o == Outcome::TimedOut),
            ],
            vec![
                "max, lost in flight".into(),
                max_of(&|o| *o == Outcome::Lost),
            ],
            vec![
                "max, any".into(),
                all.last().copied().map_or("-".to_string(), ms),
            ],
            vec![
                "deadline (2 × (call + reconnect_wait)) + margin".into(),
                format!("{} + {}", ms(self.deadline), ms(self.bound - self.deadline)),
            ],
        ];
        markdown(&mut o, &table);

        // Chaos.
        let c = &self.chaos;
        let mut table = vec![vec!["chaos".to_string(), "count".into()]];
        for (kind, n) in &c.applied {
            table.push(vec![kind.to_string(), n.to_string()]);
        }
        table.push(vec![
            "kills that found the server already down".into(),
            c.kills_missed.to_string(),
        ]);
        table.push(vec![
            "fixture process starts (stdio / http / sse)".into(),
            format!(
                "{} / {} / {}",
                c.starts.get(&Transport::Stdio).unwrap_or(&0),
                c.starts.get(&Transport::Http).unwrap_or(&0),
                c.starts.get(&Transport::Sse).unwrap_or(&0)
            ),
        ]);
        table.push(vec![
            "HTTP restarts retried (port not free yet)".into(),
            c.http_rebind_retries.to_string(),
        ]);
        table.push(vec![
            "operator reconnects refused".into(),
            c.reconnects_refused.to_string(),
        ]);
        markdown(&mut o, &table);

        // Checks.
        let e = &self.executions;
        let s = &self.settle;
        let d = &self.shutdown;
        let m = &self.memory;
        let verdict = |ok: bool| if ok { "ok" } else { "FAIL" }.to_string();
        let hung = self.count(|o| *o == Outcome::Hung);
        let unclear = self.count(|o| {
            matches!(
                o,
                Outcome::Unclear(_) | Outcome::WrongAnswer(_) | Outcome::ClientError(_)
            )
        });
        let late = self.late().len();
        let table = vec![
            vec!["check".to_string(), "measured".into(), "verdict".into()],
            vec![
                "every call answered or refused clearly (no hung, unclear, wrong or failed call)"
                    .into(),
                format!(
                    "{hung} hung, {unclear} unclear/wrong/failed of {}",
                    self.records.len()
                ),
                verdict(hung == 0 && unclear == 0),
            ],
            vec![
                format!(
                    "every call ended within deadline + margin ({})",
                    ms(self.bound)
                ),
                format!("{late} late"),
                verdict(late == 0),
            ],
            vec![
                "tools/list requests answered".into(),
                format!("{} failed", self.list_failures.len()),
                verdict(self.list_failures.is_empty()),
            ],
            vec![
                "calls of non-read-only tools executed more than once".into(),
                format!(
                    "{} duplicates ({} executions recorded)",
                    e.duplicates.len(),
                    e.total
                ),
                verdict(e.duplicates.is_empty()),
            ],
            vec![
                "read-only calls run twice (one retry allowed) / more".into(),
                format!("{} / {}", e.read_only_retried, e.read_only_excess.len()),
                verdict(e.read_only_excess.is_empty()),
            ],
            vec![
                "answers match executions (ok ⇒ ran; not sent ⇒ did not run; right server)".into(),
                format!(
                    "{} ok but not run, {} not sent but ran, {} misrouted, {} unattributed",
                    e.ok_not_executed.len(),
                    e.refused_but_executed.len(),
                    e.misrouted.len(),
                    e.unattributed.len()
                ),
                verdict(
                    e.ok_not_executed.is_empty()
                        && e.refused_but_executed.is_empty()
                        && e.misrouted.is_empty()
                        && e.unattributed.is_empty(),
                ),
            ],
            vec![
                format!(
                    "settled: every server live, tools/list exact (within {})",
                    ms(s.within)
                ),
                match s.settled_after {
                    Some(after) => format!("after {}", ms(after)),
                    None => format!("no: not live [{}]", s.not_live.join(", ")),
                },
                verdict(s.settled_after.is_some()),
            ],
            vec![
                "phantom tools (listed, no live session) after settling".into(),
                format!(
                    "{} ({} missing; {} transient while settling)",
                    s.phantoms.len(),
                    s.missing.len(),
                    s.transient_phantoms
                ),
                verdict(s.phantoms.is_empty()),
            ],
            vec![
                "each server answers through the gateway after settling".into(),
                format!("{}/{}", s.verified, s.servers),
                verdict(s.unverified.is_empty() && s.pid_mismatch.is_empty()),
            ],
            vec![
                "gateway exits 0 on SIGTERM".into(),
                format!("code {:?} after {}", d.exit_code, ms(d.took)),
                verdict(d.exited && d.exit_code == Some(0)),
            ],
            vec![
                "calls in flight at SIGTERM answered (slow: ok; hung: timed out)".into(),
                format!(
                    "{}/{}",
                    d.in_flight.len() - d.in_flight_wrong().len(),
                    d.in_flight.len()
                ),
                verdict(d.in_flight_wrong().is_empty()),
            ],
            vec![
                "fixture processes left after the gateway exited".into(),
                d.leftovers.len().to_string(),
                verdict(d.leftovers.is_empty()),
            ],
            vec![
                format!("gateway peak RSS (VmHWM) ≤ {}", kib(m.limit_kib)),
                format!(
                    "{} (RSS {} when ready, max sampled {}; fds {} → {})",
                    kib(m.hwm_kib),
                    kib(m.rss_ready_kib),
                    kib(m.rss_max_kib),
                    m.fds_ready,
                    m.fds_end
                ),
                verdict(m.hwm_kib <= m.limit_kib),
            ],
        ];
        markdown(&mut o, &table);
        o
    }
}

/// Appends a Markdown table: the first row is the header.
fn markdown(out: &mut String, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    for (n, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
        if n == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            let _ = writeln!(out, "|-{}-|", rule.join("-|-"));
        }
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, server: &str, tool: ToolKind, outcome: Outcome) -> CallRecord {
        CallRecord {
            id,
            client: Some(0),
            server: server.into(),
            tool,
            started: Duration::ZERO,
            latency: Duration::from_millis(1),
            outcome,
        }
    }

    #[test]
    fn executions_are_matched_with_calls() {
        let records = vec![
            record(1, "a", ToolKind::SideEffect, Outcome::Ok),
            record(2, "a", ToolKind::SideEffect, Outcome::Lost),
            record(3, "b", ToolKind::Add, Outcome::Ok),
            record(
                4,
                "b",
                ToolKind::Echo,
                Outcome::NotSent(super::super::clients::NotSent::Reconnecting),
            ),
            record(5, "a", ToolKind::Echo, Outcome::Ok),
        ];
        let logs = vec![
            (
                "a".to_string(),
                "side_effect {\"label\":\"chaos-1\"}\nside_effect {\"label\":\"chaos-2\"}\nside_effect {\"label\":\"chaos-2\"}\n"
                    .to_string(),
            ),
            (
                "b".to_string(),
                "add {\"a\":3,\"b\":1}\nadd {\"a\":3,\"b\":1}\necho {\"text\":\"chaos-4\"}\necho {\"text\":\"chaos-5\"}\necho {\"text\":\"chaos-99\"}\n"
                    .to_string(),
            ),
        ];
        let e = Executions::check(&records, &logs);
        assert_eq!(e.total, 8);
        assert_eq!(e.duplicates, vec![(2, 2)]);
        assert_eq!(e.read_only_retried, 1);
        assert_eq!(e.refused_but_executed, vec![4]);
        assert_eq!(e.misrouted, vec![5]);
        assert!(e.ok_not_executed.is_empty());
        assert_eq!(e.unattributed.len(), 1);
    }
}
