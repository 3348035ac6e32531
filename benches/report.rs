//! How long the report's layered layout takes to draw a graph of 2,000
//! nodes (a chain with residual edges in nested regions, the shape
//! `tests/report.rs` draws): the figure `src/report/layout.rs` quotes.
//!
//!     cargo bench --bench report
use criterion::{criterion_group, criterion_main, Criterion};
use std::time::Duration;

fn big_graph(n: usize) -> kiln::ir::Graph {
    let mut text = String::from("%0: f32[64,128] = input 0\n");
    for i in 1..n {
        let region = format!(" @block{}/layer{}", i / 400, (i / 50) % 8);
        if i % 7 == 0 && i > 10 {
            text.push_str(&format!("%{i}: f32[64,128] = add %{}, %{}{region}\n", i - 1, i - 1 - (i % 5) - 2));
        } else {
            let op = ["exp", "tanh", "relu", "neg"][i % 4];
            text.push_str(&format!("%{i}: f32[64,128] = {op} %{}{region}\n", i - 1));
        }
    }
    text.push_str(&format!("return %{}\n", n - 1));
    kiln::ir::text::parse(&text).expect("the bench's graph parses")
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("report_layout");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for n in [200usize, 2000] {
        let graph = big_graph(n);
        g.bench_function(format!("{n}_nodes"), |b| b.iter(|| kiln::report::graph_svg(&graph)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
