use super::*;
use crate::ir::fused::inline_fused;
use crate::ir::text::{parse, print};
use crate::ir::{FusedKind, Op};

fn fuse(src: &str) -> (Graph, PassCtx) {
    let mut g = parse(src).expect("parses");
    let mut cx = PassCtx::default();
    Fusion.run(&mut g, &mut cx).expect("fusion runs");
    crate::ir::verify(&g).expect("verifies");
    (g, cx)
}

fn fused_kinds(g: &Graph) -> Vec<&'static str> {
    g.topo_order()
        .into_iter()
        .filter_map(|id| match &g.node(id).op {
            Op::Fused(body) => Some(body.kind().name()),
            _ => None,
        })
        .collect()
}

const SOFTMAX: &str = "%x: f32[4,8] = input 0\n%m: f32[4,1] = max %x dims=[1] keepdim\n\
    %mb: f32[4,8] = expand %m\n%d: f32[4,8] = sub %x, %mb\n%e: f32[4,8] = exp %d\n\
    %s: f32[4,1] = sum %e dims=[1] keepdim\n%sb: f32[4,8] = expand %s\n\
    %y: f32[4,8] = div %e, %sb\nreturn %y\n";

const CHAIN: &str = "%x: f32[4,8] = input 0\n%c: f32[] = full 1.5\n%cb: f32[4,8] = expand %c\n\
    %a: f32[4,8] = mul %x, %cb\n%b: f32[4,8] = abs %a\n%z: f32[4,8] = add %b, %x\n\
    %o: f32[4,8] = tanh %z\nreturn %o\n";

/// Inlining the bodies gives back the input exactly when nothing was
/// copied into two bodies and every member shares the root's region.
#[test]
fn inlining_gives_back_the_input() {
    for src in [SOFTMAX, CHAIN] {
        let (g, _) = fuse(src);
        assert_eq!(fused_kinds(&g).len(), 1, "{}", print(&g));
        assert_eq!(print(&inline_fused(&g)), print(&parse(src).unwrap()));
    }
}

#[test]
fn kinds_and_note() {
    let (g, cx) = fuse(SOFTMAX);
    assert!(matches!(fused_kinds(&g)[..], ["reduction"]));
    let out = g.outputs()[0];
    let Op::Fused(body) = &g.node(out).op else { panic!("not fused: {}", print(&g)) };
    assert_eq!(body.kind(), &FusedKind::Reduction { domain: crate::ir::Shape::new([4, 8]), split: 1 });
    // Before: max, sub, exp, sum, div (expands are views). After: one.
    // Bytes: max 16 + 128, sub 128 + 144, exp 128 + 128, sum 16 + 128,
    // div 128 + 144; fused: read x, write y.
    assert_eq!(cx.notes, ["kernels 5 -> 1, bytes moved 1088 B -> 256 B"]);
    assert_eq!(cx.stats.rewrites, 1);
}

#[test]
fn same_graph_same_text() {
    // The same structure written in another line order (other ids).
    let a = "%x: f32[4] = input 0\n%y: f32[4] = input 1\n%e: f32[4] = exp %x\n%f: f32[4] = exp %y\n\
             %m: f32[4] = mul %e, %f\n%s: f32[4] = sqrt %e\nreturn %m, %s\n";
    let b = "%y: f32[4] = input 1\n%f: f32[4] = exp %y\n%x: f32[4] = input 0\n%e: f32[4] = exp %x\n\
             %s: f32[4] = sqrt %e\n%m: f32[4] = mul %e, %f\nreturn %m, %s\n";
    let (ga, _) = fuse(a);
    let (gb, _) = fuse(b);
    assert_eq!(print(&ga), print(&gb));
    assert_eq!(print(&ga), print(&fuse(a).0));
}

/// A deep MLP (matmul, bias, relu per layer) fuses every epilogue, and a
/// long walk stays fast (no per-node scan of the graph).
#[test]
fn deep_mlp_is_linear() {
    let layers = 2000;
    let mut src = String::from(
        "%h0: f32[4,8] = input 0\n%w: f32[8,8] = input 1\n%b: f32[8] = input 2\n\
                                %be: f32[4,8] = expand %b\n",
    );
    for i in 0..layers {
        src.push_str(&format!(
            "%m{i}: f32[4,8] = matmul %h{i}, %w\n%z{i}: f32[4,8] = add %m{i}, %be\n%h{}: f32[4,8] = relu %z{i}\n",
            i + 1
        ));
    }
    src.push_str(&format!("return %h{layers}\n"));
    let start = std::time::Instant::now();
    let (g, cx) = fuse(&src);
    let took = start.elapsed();
    assert_eq!(fused_kinds(&g), vec!["matmul"; layers]);
    assert_eq!(cx.stats.rewrites, layers);
    assert!(took.as_secs() < 20, "fusion of {layers} layers took {took:?}");
}

/// Over every pass test case in the repo: no group is ever left unfused
/// because its body broke the contract (that would be a grouping bug the
/// graceful fallback hides), and fusing twice changes nothing more than
/// wrapping nothing (a fused graph has no loose elementwise work left).
#[test]
fn every_case_builds_legal_bodies() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/passes");
    let mut files: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kir"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "{files:?}");
    for path in files {
        let case = crate::ir::text::parse_test_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut g = case.graph;
        let mut cx = PassCtx::default();
        Fusion.run(&mut g, &mut cx).unwrap();
        assert!(cx.notes.iter().all(|n| !n.contains("unfused")), "{}: {:?}", path.display(), cx.notes);
        let once = print(&g);
        Fusion.run(&mut g, &mut PassCtx::default()).unwrap();
        assert_eq!(print(&g), once, "{}: a second run changed the graph", path.display());
    }
}
