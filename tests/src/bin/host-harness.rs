//! A minimal host for tests that must kill the host itself: supervises one stdio fixture
//! server (with any extra fixture flags), prints `ready <child pid>` once its tools are visible,
//! then runs until killed.

use std::time::Duration;

use tether::config::ServerSpec;
use tether::policy::{PolicyRuntime, RuntimeOptions};
use tether::supervisor::Supervisor;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(fixture), Some(state_dir), Some(log_dir)) = (args.next(), args.next(), args.next())
    else {
        eprintln!("usage: host-harness FIXTURE STATE_DIR LOG_DIR [FIXTURE_FLAG...]");
        std::process::exit(2);
    };
    let extra: Vec<String> = args.collect();
    let policy = PolicyRuntime::start(RuntimeOptions::default()).expect("policy starts");
    let supervisor = Supervisor::start(policy, log_dir.into());
    let mut fixture_args = vec!["--transport", "stdio", "--state-dir", &state_dir];
    fixture_args.extend(extra.iter().map(String::as_str));
    let spec = ServerSpec::stdio("child", fixture, &fixture_args);
    supervisor.add_server(spec).expect("new server");
    loop {
        if let Some(pid) = supervisor.views()[0].pid
            && !supervisor.registry().server_tools("child").is_empty()
        {
            println!("ready {pid}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::future::pending::<()>().await;
}
