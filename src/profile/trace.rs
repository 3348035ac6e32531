//! Chrome trace JSON (the Trace Event Format's complete events): what
//! Perfetto and `chrome://tracing` open. Each plan is a process, each of
//! its streams a thread (track), each node run a slice; runs follow each
//! other on the time axis in the order they ran, each starting where the
//! previous one ended.

use super::Profile;
use std::fmt::Write;

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub(super) fn chrome_trace(p: &Profile) -> String {
    let plans = p.plan_numbers();
    let mut events: Vec<String> = Vec::new();
    let mut named = std::collections::BTreeSet::new();
    let mut t0 = 0.0;
    for (k, run) in p.runs.iter().enumerate() {
        let pid = plans[&run.plan];
        if named.insert((pid, u32::MAX)) {
            events.push(format!(
                "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"args\":{{\"name\":{}}}}}",
                json_str(&format!("plan {pid} ({:016x}, {})", run.plan, run.device))
            ));
            events.push(format!(
                "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":1000,\"args\":{{\"name\":\"runs\"}}}}"
            ));
        }
        events.push(format!(
            "{{\"ph\":\"X\",\"name\":\"run {k}\",\"cat\":\"run\",\"pid\":{pid},\"tid\":1000,\"ts\":{t0:.3},\"dur\":{:.3}}}",
            run.wall_us
        ));
        for n in &run.nodes {
            if named.insert((pid, n.stream)) {
                events.push(format!(
                    "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{},\"args\":{{\"name\":\"stream {}\"}}}}",
                    n.stream, n.stream
                ));
            }
            events.push(format!(
                "{{\"ph\":\"X\",\"name\":{},\"cat\":\"node\",\"pid\":{pid},\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"node\":\"%{}\",\"region\":{}}}}}",
                json_str(&format!("{}%{} {}", if n.prologue { "prologue " } else { "" }, n.node, n.op)),
                n.stream,
                t0 + n.start_us,
                n.dur_us,
                n.node,
                json_str(&n.region)
            ));
        }
        t0 += run.wall_us;
    }
    format!("{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n{}\n]}}\n", events.join(",\n"))
}
