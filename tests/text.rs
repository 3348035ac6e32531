//! The text IR, DOT export and verifier: round trips over every `.kir` file
//! in `tests/`, coverage of every op and dtype, golden error messages, and
//! a garbled-input test that the parser never panics.

use kiln::ir::text::{parse, parse_test_file, print};
use kiln::ir::{
    dot::to_dot, verify, BinaryOp, CompareOp, DType, Distribution, Graph, Node, NodeId, Op, ReduceOp,
    RegionId, Scalar, Shape, UnaryOp,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Runs `f` with insta writing to the repo-root `snapshots/` directory.
fn snap(f: impl FnOnce()) {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s.bind(f);
}

fn kir_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect::<Vec<_>>();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            kir_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "kir") {
            out.push(p);
        }
    }
}

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// Parses a file of either kind: a pass test file when its first non-blank
/// line starts with `test `, a plain graph otherwise.
fn parse_any(src: &str) -> kiln::Result<Graph> {
    let first = src.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    if first.starts_with("test ") || first == "test" {
        parse_test_file(src).map(|t| t.graph)
    } else {
        parse(src)
    }
}

fn own_files() -> Vec<(PathBuf, Graph)> {
    let mut files = Vec::new();
    kir_files(&tests_dir().join("text"), &mut files);
    files
        .into_iter()
        .map(|p| {
            let g = parse(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, g)
        })
        .collect()
}

#[test]
fn every_kir_file_round_trips_and_verifies() {
    let mut files = Vec::new();
    kir_files(&tests_dir(), &mut files);
    assert!(files.len() >= 4, "expected the .kir files of tests/text, found {files:?}");
    for path in files {
        let src = std::fs::read_to_string(&path).unwrap();
        let name = path.display();
        let g = parse_any(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
        verify(&g).unwrap_or_else(|e| panic!("{name}: parsed graph does not verify: {e}"));
        let printed = print(&g);
        let again =
            parse(&printed).unwrap_or_else(|e| panic!("{name}: printed text does not parse: {e}\n{printed}"));
        verify(&again).unwrap_or_else(|e| panic!("{name}: reparsed graph does not verify: {e}"));
        assert_eq!(printed, print(&again), "{name}: print -> parse -> print differs");
        assert_eq!(printed, print(&g.compacted()), "{name}: compacting changes the print");
    }
}

#[test]
fn own_files_cover_every_op_and_dtype() {
    let mut ops = BTreeSet::new();
    let mut dtypes = BTreeSet::new();
    let mut regions = false;
    for (_, g) in own_files() {
        for id in g.topo_order() {
            let n = g.node(id);
            ops.insert(n.op.mnemonic());
            dtypes.insert(n.dtype);
            regions |= n.region != RegionId::ROOT;
        }
    }
    let mut all: Vec<&str> = [
        "input",
        "buffer",
        "full",
        "arange",
        "rand",
        "randn",
        "reshape",
        "permute",
        "expand",
        "slice",
        "where",
        "cast",
        "matmul",
        "conv2d",
        "max_pool2d",
        "avg_pool2d",
        "max_pool2d_grad",
        "gather",
        "index_select",
        "cat",
    ]
    .to_vec();
    all.extend(UnaryOp::ALL.iter().map(|u| u.mnemonic()));
    all.extend(BinaryOp::ALL.iter().map(|b| b.mnemonic()));
    all.extend(CompareOp::ALL.iter().map(|c| c.mnemonic()));
    all.extend(ReduceOp::ALL.iter().map(|r| r.mnemonic()));
    let missing: Vec<&str> = all.into_iter().filter(|m| !ops.contains(m)).collect();
    assert!(missing.is_empty(), "ops no tests/text file uses: {missing:?}");
    let missing: Vec<DType> = DType::ALL.into_iter().filter(|d| !dtypes.contains(d)).collect();
    assert!(missing.is_empty(), "dtypes no tests/text file uses: {missing:?}");
    assert!(regions);
}

#[test]
fn print_renumbers_hand_written_names_and_drops_dead_nodes() {
    let src = std::fs::read_to_string(tests_dir().join("text/regions.kir")).unwrap();
    snap(|| insta::assert_snapshot!("text__print_regions", print(&parse(&src).unwrap())));
}

#[test]
fn print_of_the_documented_example_is_the_example() {
    let src = std::fs::read_to_string(tests_dir().join("text/mlp.kir")).unwrap();
    let body: String = src.lines().filter(|l| !l.starts_with(";;")).map(|l| format!("{l}\n")).collect();
    assert_eq!(print(&parse(&src).unwrap()), body);
}

#[test]
fn test_file_header_settings_and_comment() {
    let src = "\n  test fusion max-nodes=4 epilogue\n;; A relu after a matmul\n;;   fuses into it.\n;;\n\n;; not part of the comment\n%0: f32[2] = input 0\n%1: f32[2] = relu %0\nreturn %1\n";
    let t = parse_test_file(src).unwrap();
    assert_eq!(t.pass, "fusion");
    assert_eq!(t.settings, vec!["max-nodes=4".to_string(), "epilogue".to_string()]);
    assert_eq!(t.comment, "A relu after a matmul\n  fuses into it.");
    assert_eq!(print(&t.graph), "%0: f32[2] = input 0\n%1: f32[2] = relu %0\nreturn %1\n");
    // Errors count lines from the top of the file.
    let err = parse_test_file("test dce\n;; c\n%0: f32[2] = input 0\nreturn %9\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "parse error at line 4: undefined value %9 (values must be defined before use)"
    );
}

/// Constants survive print -> parse bit for bit (up to NaN payloads), for
/// awkward values in every dtype.
#[test]
fn constants_round_trip_exactly() {
    let values = [
        0.0,
        -0.0,
        1.0 / 3.0,
        0.1,
        -2.5e-8,
        6.1e-5,
        65504.0,
        1e38,
        3.4028234663852886e38,
        f64::MIN_POSITIVE,
        5e-324,
        1e300,
        -123456789.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        255.0,
        -9.2e18,
    ];
    for dtype in DType::ALL {
        let mut g = Graph::new();
        let mut outputs = Vec::new();
        for (i, &v) in values.iter().enumerate() {
            let c = Scalar::Float(v).cast(dtype);
            let full = g.add(Op::Full(c), &[], Some((Shape::new([2]), dtype)), RegionId::ROOT).unwrap();
            outputs.push(full);
            if dtype.is_numeric() && i + 1 < values.len() {
                let step = Scalar::Float(values[i + 1]).cast(dtype);
                let a = Op::Arange { start: c, step };
                outputs.push(g.add(a, &[], Some((Shape::new([3]), dtype)), RegionId::ROOT).unwrap());
            }
        }
        g.set_outputs(outputs);
        verify(&g).unwrap();
        let text = print(&g);
        let back = parse(&text).unwrap_or_else(|e| panic!("{dtype}: {e}\n{text}"));
        assert_eq!(text, print(&back));
        let scalars = |g: &Graph| -> Vec<(u8, u64)> {
            let mut out = Vec::new();
            for id in g.topo_order() {
                let ss = match g.node(id).op {
                    Op::Full(v) => vec![v],
                    Op::Arange { start, step } => vec![start, step],
                    _ => vec![],
                };
                for s in ss {
                    out.push(match s {
                        Scalar::Float(f) if f.is_nan() => (0, 0),
                        s => s.hash_bits(),
                    });
                }
            }
            out
        };
        assert_eq!(scalars(&g), scalars(&back), "{dtype}:\n{text}");
    }
}

#[test]
fn empty_graph_round_trips() {
    let g = parse("return\n").unwrap();
    assert_eq!(print(&g), "return\n");
    assert_eq!(print(&Graph::new()), "return\n");
}

// ---------------------------------------------------------------- errors

/// The snapshot holds the input and the whole message, so a reviewer reads both.
fn parse_error(name: &str, src: &str) {
    let err = parse_any(src).expect_err(name);
    assert!(matches!(err, kiln::Error::Parse { .. }));
    snap(|| insta::assert_snapshot!(name, format!("{src}---\n{err}")));
}

#[test]
fn parse_errors() {
    let x = "%x: f32[2,3] = input 0\n";
    // Found by fuzzing (issue 11): a schedule listing a node the outputs do
    // not need parsed, then failed `verify`, and printing it dropped the
    // node with its `!record`, so the printed text did not parse.
    parse_error(
        "text__parse_error_dead_node_in_schedule",
        "plan schedule streams=2\n%x: f32[2] = input 0 !stream=0\n\
         %dead: f32[2] = fused %x kind=elementwise !stream=1 !record=e0 {\n    %0: f32[2] = input 0\n    \
         %1: f32[2] = exp %0\n    return %1\n}\n%y: f32[2] = neg %x !stream=0 !wait=e0\nreturn %y\n",
    );
    parse_error("text__parse_error_undefined_value", &format!("{x}%1: f32[2,3] = add %x, %7\nreturn %1\n"));
    parse_error("text__parse_error_unknown_op", &format!("{x}%1: f32[2,3] = mull %x, %x\nreturn %1\n"));
    parse_error(
        "text__parse_error_unknown_op_no_suggestion",
        &format!("{x}%1: f32[2,3] = frobnicate %x\nreturn %1\n"),
    );
    parse_error("text__parse_error_bad_dtype", "%x: f31[2,3] = input 0\nreturn %x\n");
    // A `kv+q` attention gradient writes one extra output, the queries'
    // gradient; a `q` gradient writes none.
    let grads = "%q: bf16[1,2,3,4] = input 0\n%st: f32[1,2,3,2] = input 1\n\
                 %g: bf16[1,2,3,8] = attention_grad %q, %q, %q, %q, %st wrt=kv+q scale=0.5 mask=none\n";
    parse_error(
        "text__parse_error_kv_q_gradient_output_2",
        &format!("{grads}%e: bf16[1,2,3,4] = extra %g output=2\nreturn %e\n"),
    );
    parse_error(
        "text__parse_error_q_gradient_extra",
        &format!(
            "{grads}%dq: bf16[1,2,3,4] = attention_grad %q, %q, %q, %q, %st wrt=q scale=0.5 mask=none\n\
             %e: bf16[1,2,3,4] = extra %dq output=1\nreturn %e\n"
        ),
    );
    // A widening sum only widens floats, and only a sum or a mean.
    parse_error(
        "text__parse_error_narrowing_sum",
        "%x: f32[2,3] = input 0\n%1: bf16[3] = sum %x dims=[0] into=bf16\nreturn %1\n",
    );
    parse_error(
        "text__parse_error_widening_max",
        "%x: bf16[2,3] = input 0\n%1: f32[3] = max %x dims=[0] into=f32\nreturn %1\n",
    );
    parse_error(
        "text__parse_error_into_not_a_dtype",
        &format!("{x}%1: f32[3] = sum %x dims=[0] into=wide\nreturn %1\n"),
    );
    parse_error("text__parse_error_missing_return", &format!("{x}%1: f32[2,3] = neg %x\n"));
    parse_error("text__parse_error_empty_input", "");
    parse_error("text__parse_error_type_mismatch", &format!("{x}%1: f32[3,2] = neg %x\nreturn %1\n"));
    parse_error(
        "text__parse_error_infer",
        &format!("{x}%y: f32[3,2] = input 1\n%1: f32[2,3] = add %x, %y\nreturn %1\n"),
    );
    parse_error("text__parse_error_arity", &format!("{x}%1: f32[2,3] = mul %x\nreturn %1\n"));
    parse_error("text__parse_error_defined_twice", &format!("{x}%x: f32[2,3] = neg %x\nreturn %x\n"));
    parse_error(
        "text__parse_error_use_before_definition",
        "%1: f32[2] = neg %2\n%2: f32[2] = input 0\nreturn %1\n",
    );
    parse_error("text__parse_error_bad_scalar", "%0: i32[2] = full 0.5\nreturn %0\n");
    parse_error("text__parse_error_bad_bool", "%0: bool[2] = full 1\nreturn %0\n");
    parse_error(
        "text__parse_error_missing_attribute",
        &format!("{x}%1: f32[2,1] = slice %x dim=1 start=0 step=1\nreturn %1\n"),
    );
    parse_error(
        "text__parse_error_unknown_attribute",
        &format!("{x}%1: f32[3,2] = permute %x perm=[1,0] axis=2\nreturn %1\n"),
    );
    parse_error(
        "text__parse_error_attribute_twice",
        &format!("{x}%1: f32[2] = sum %x dims=[1] dims=[1]\nreturn %1\n"),
    );
    parse_error("text__parse_error_pair_attribute", "%x: f32[1,1,4,4] = input 0\n%1: f32[1,1,2,2] = max_pool2d %x kernel=[2] stride=[2,2] padding=[0,0]\nreturn %1\n");
    parse_error("text__parse_error_missing_comma", &format!("{x}%1: f32[2,3] = add %x %x\nreturn %1\n"));
    parse_error("text__parse_error_missing_colon", "%x f32[2,3] = input 0\nreturn %x\n");
    parse_error("text__parse_error_bad_dimension", "%x: f32[2,-3] = input 0\nreturn %x\n");
    parse_error("text__parse_error_text_after_return", &format!("{x}return %x\n%y: f32[2,3] = neg %x\n"));
    parse_error("text__parse_error_random_int", "%0: i32[4] = randn stream=0\nreturn %0\n");
    parse_error("text__parse_error_arange_2d", "%0: i64[2,2] = arange start=0 step=1\nreturn %0\n");
    parse_error(
        "text__parse_error_input_slot_conflict",
        "%a: f32[2] = input 0\n%b: f32[3] = input 0\nreturn %a, %b\n",
    );
    parse_error("text__parse_error_test_header_in_plain_file", "%0: f32[2] = input 0\ntest dce\nreturn %0\n");
    parse_error("text__parse_error_test_file_without_pass", "test\n%0: f32[2] = input 0\nreturn %0\n");
    parse_error("text__parse_error_empty_region", &format!("{x}%1: f32[2,3] = neg %x @\nreturn %1\n"));
    parse_error(
        "text__parse_error_region_line_after_a_definition",
        &format!("{x}region a autocast=bf16\nreturn %x\n"),
    );
    parse_error(
        "text__parse_error_region_autocast_not_low",
        &format!("region a autocast=f64\n{x}return %x\n"),
    );
    parse_error(
        "text__parse_error_region_autocast_on_the_root",
        &format!("region / autocast=bf16\n{x}return %x\n"),
    );
    parse_error("text__parse_error_zero_kernel_conv", "%x: f32[1,1,4,4] = input 0\n%w: f32[1,1,0,3] = input 1\n%1: f32[1,1,5,2] = conv2d %x, %w stride=[1,1] padding=[0,0] dilation=[1,1] groups=1\nreturn %1\n");
    parse_error(
        "text__parse_error_slice_overflow",
        &format!("{x}%1: f32[2,3] = slice %x dim=0 start=1 step=9223372036854775807 len=3\nreturn %1\n"),
    );
}

// ------------------------------------------------------------- verifier

fn node(op: Op, shape: impl Into<Shape>, dtype: DType) -> Node {
    Node { op, shape: shape.into(), dtype, region: RegionId::ROOT }
}

fn verify_error(name: &str, g: &Graph) {
    let err = verify(g).expect_err(name);
    assert!(matches!(err, kiln::Error::Verify(_)));
    // Printing an invalid graph must not panic either; the snapshot shows it.
    snap(|| insta::assert_snapshot!(name, format!("{}---\n{err}", raw_listing(g))));
}

/// The graph by its own node ids (as verifier messages name them), unlike
/// `print`, which renumbers; for reading verifier snapshots.
fn raw_listing(g: &Graph) -> String {
    let mut out = String::new();
    for id in g.node_ids() {
        let n = g.node(id);
        let ops: Vec<String> = g.operands(id).iter().map(|o| o.to_string()).collect();
        out += &format!(
            "{id}: {}{} = {:?} {} (region {})\n",
            n.dtype,
            n.shape,
            n.op,
            ops.join(", "),
            n.region.0
        );
    }
    let outs: Vec<String> = g.outputs().iter().map(|o| o.to_string()).collect();
    out + &format!("outputs {}\n", outs.join(", "))
}

/// `%0: f32[2,3] = input 0`, the start of most hand-built cases.
fn with_input() -> (Graph, NodeId) {
    let mut g = Graph::new();
    let x = g.add_unchecked(node(Op::Input(0), [2, 3], DType::F32), &[]);
    (g, x)
}

#[test]
fn verifier_errors() {
    // Declared type differs from the inferred one.
    let (mut g, x) = with_input();
    let y = g.add_unchecked(node(Op::Unary(UnaryOp::Neg), [2, 3], DType::F32), &[x]);
    let m = g.add_unchecked(node(Op::Binary(BinaryOp::Mul), [3, 2], DType::F32), &[x, y]);
    g.set_outputs(vec![m]);
    verify_error("text__verify_error_type_mismatch", &g);

    // Wrong dtype only.
    let (mut g, x) = with_input();
    let c = g.add_unchecked(node(Op::Compare(CompareOp::Lt), [2, 3], DType::F32), &[x, x]);
    g.set_outputs(vec![c]);
    verify_error("text__verify_error_dtype_mismatch", &g);

    // Operand count.
    let (mut g, x) = with_input();
    let m = g.add_unchecked(node(Op::Binary(BinaryOp::Add), [2, 3], DType::F32), &[x]);
    g.set_outputs(vec![m]);
    verify_error("text__verify_error_arity", &g);

    // A source op with an operand.
    let (mut g, x) = with_input();
    let f = g.add_unchecked(node(Op::Full(Scalar::Float(1.0)), [2, 3], DType::F32), &[x]);
    g.set_outputs(vec![f]);
    verify_error("text__verify_error_source_with_operand", &g);

    // infer rejects the operands.
    let (mut g, x) = with_input();
    let i = g.add_unchecked(node(Op::Input(1), [2, 3], DType::I64), &[]);
    let a = g.add_unchecked(node(Op::Binary(BinaryOp::Add), [2, 3], DType::F32), &[x, i]);
    g.set_outputs(vec![a]);
    verify_error("text__verify_error_mixed_dtypes", &g);

    // A cycle.
    let (mut g, x) = with_input();
    let a = g.add_unchecked(node(Op::Unary(UnaryOp::Neg), [2, 3], DType::F32), &[x]);
    let b = g.add_unchecked(node(Op::Unary(UnaryOp::Exp), [2, 3], DType::F32), &[a]);
    let c = g.add_unchecked(node(Op::Binary(BinaryOp::Add), [2, 3], DType::F32), &[b, x]);
    g.set_operands(a, &[c]);
    g.set_outputs(vec![c]);
    verify_error("text__verify_error_cycle", &g);

    // Random of an integer dtype.
    let mut g = Graph::new();
    let r =
        g.add_unchecked(node(Op::Random { dist: Distribution::Uniform, stream: 0 }, [4], DType::I32), &[]);
    g.set_outputs(vec![r]);
    verify_error("text__verify_error_random_int", &g);

    // Arange that is not 1-D, and one of bool.
    let mut g = Graph::new();
    let r = g.add_unchecked(
        node(Op::Arange { start: Scalar::Int(0), step: Scalar::Int(1) }, [2, 2], DType::I64),
        &[],
    );
    g.set_outputs(vec![r]);
    verify_error("text__verify_error_arange_2d", &g);
    let mut g = Graph::new();
    let r = g.add_unchecked(
        node(Op::Arange { start: Scalar::Bool(false), step: Scalar::Bool(true) }, [2], DType::Bool),
        &[],
    );
    g.set_outputs(vec![r]);
    verify_error("text__verify_error_arange_bool", &g);

    // Constants that the dtype cannot hold exactly.
    let mut g = Graph::new();
    let f = g.add_unchecked(node(Op::Full(Scalar::Float(0.1)), [2], DType::F16), &[]);
    g.set_outputs(vec![f]);
    verify_error("text__verify_error_full_inexact", &g);
    let mut g = Graph::new();
    let f = g.add_unchecked(node(Op::Full(Scalar::Int(3)), [2], DType::F32), &[]);
    g.set_outputs(vec![f]);
    verify_error("text__verify_error_full_wrong_carrier", &g);
    let mut g = Graph::new();
    let f = g.add_unchecked(
        node(Op::Arange { start: Scalar::Int(0), step: Scalar::Int(300) }, [2], DType::U8),
        &[],
    );
    g.set_outputs(vec![f]);
    verify_error("text__verify_error_arange_step_inexact", &g);

    // Two inputs with one slot and different types.
    let (mut g, x) = with_input();
    let y = g.add_unchecked(node(Op::Input(0), [3, 2], DType::F32), &[]);
    g.set_outputs(vec![x, y]);
    verify_error("text__verify_error_input_slot_conflict", &g);

    // A region that does not exist.
    let (mut g, x) = with_input();
    let mut n = node(Op::Unary(UnaryOp::Neg), [2, 3], DType::F32);
    n.region = RegionId(7);
    let y = g.add_unchecked(n, &[x]);
    g.set_outputs(vec![y]);
    verify_error("text__verify_error_missing_region", &g);

    // An output that was removed.
    let (mut g, x) = with_input();
    let y = g.add_unchecked(node(Op::Unary(UnaryOp::Neg), [2, 3], DType::F32), &[x]);
    g.set_outputs(vec![x, y]);
    g.remove(y);
    g.set_outputs(vec![x, y]);
    verify_error("text__verify_error_missing_output", &g);
}

#[test]
fn verifier_accepts_nan_constants_and_unreached_nodes() {
    let g = parse("%0: f32[2] = full nan\n%1: f16[2] = full -inf\nreturn %0, %1\n").unwrap();
    verify(&g).unwrap();
    let (mut g, x) = with_input();
    g.add_unchecked(node(Op::Unary(UnaryOp::Neg), [2, 3], DType::F32), &[x]);
    verify(&g).unwrap();
}

// ------------------------------------------------------------------ DOT

#[test]
fn dot_with_nested_regions() {
    let src = "\
%x: f32[2,3] = input 0
%w: f32[3,4] = input 1 @model/layer1
%h: f32[2,4] = matmul %x, %w @model/layer1
%a: f32[2,4] = relu %h @model/layer1
%s: f32[2,1] = sum %a dims=[1] keepdim @model
%n: f32[2,1] = neg %s
return %n, %a
";
    let g = parse(src).unwrap();
    let dot = to_dot(&g);
    assert_eq!(dot, to_dot(&parse(&print(&g)).unwrap()));
    snap(|| insta::assert_snapshot!("text__dot_nested_regions", dot));
}

// ------------------------------------------------------------ no panics

/// Feeds truncated and garbled versions of a valid file to the parser:
/// each must give `Ok` or `Err`, never a panic, and every `Ok` must verify
/// and round-trip.
#[test]
fn garbled_input_never_panics() {
    let src = std::fs::read_to_string(tests_dir().join("text/all_ops.kir")).unwrap()
        + &std::fs::read_to_string(tests_dir().join("text/dtypes.kir"))
            .unwrap()
            .replace("%", "%d_")
            .replace("input 0", "input 5");
    let src = src.replacen("return", ";; return", 1);
    let chars: Vec<char> = src.chars().collect();
    let mut cases: Vec<String> = Vec::new();
    for i in 0..chars.len() {
        cases.push(chars[..i].iter().collect());
        let mut deleted = chars.clone();
        deleted.remove(i);
        cases.push(deleted.into_iter().collect());
        for r in ['%', ',', '[', ']', '=', ':', '@', '0', '9', ' ', '\n', '-', 'x', 'é'] {
            let mut c = chars.clone();
            c[i] = r;
            cases.push(c.into_iter().collect());
        }
    }
    for (i, line) in src.lines().enumerate() {
        // Each line twice, and each line dropped.
        let lines: Vec<&str> = src.lines().collect();
        let mut dup = lines.clone();
        dup.insert(i, line);
        cases.push(dup.join("\n"));
        let mut drop = lines.clone();
        drop.remove(i);
        cases.push(drop.join("\n"));
    }
    // Independent cases, spread over the cores (CI's time: this was the
    // binary's longest test).
    let check = |case: &String| -> std::result::Result<bool, String> {
        std::panic::catch_unwind(|| {
            let mut parsed = false;
            for g in [parse(case), parse_test_file(&format!("test x\n{case}")).map(|t| t.graph)]
                .into_iter()
                .flatten()
            {
                verify(&g).unwrap();
                let p = print(&g);
                assert_eq!(p, print(&parse(&p).unwrap()));
                let _ = to_dot(&g);
                parsed = true;
            }
            parsed
        })
        .map_err(|_| format!("panicked on input:\n{case}"))
    };
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = cases.len().div_ceil(threads);
    let ok: usize = std::thread::scope(|s| {
        let hs: Vec<_> =
            cases.chunks(chunk).map(|part| s.spawn(|| part.iter().map(check).collect::<Vec<_>>())).collect();
        let mut ok = 0;
        for h in hs {
            for r in h.join().expect("a checking thread") {
                match r {
                    Ok(parsed) => ok += parsed as usize,
                    Err(m) => panic!("{m}"),
                }
            }
        }
        ok
    });
    assert!(ok > 100, "too few garbled cases parsed ({ok}); the test is not exercising Ok paths");
}

#[test]
fn huge_numbers_are_errors_not_panics() {
    for src in [
        "%x: f32[18446744073709551615,18446744073709551615] = input 0\n%1: f32[1] = reshape %x\nreturn %1\n",
        "%x: f32[1,1,4,4] = input 0\n%1: f32[1,1,1,1] = avg_pool2d %x kernel=[2,2] stride=[2,2] padding=[9223372036854775807,0]\nreturn %1\n",
        "%x: f32[1,1,4,4] = input 0\n%w: f32[1,1,1,1] = input 1\n%1: f32[1,1,1,1] = conv2d %x, %w stride=[1,1] padding=[9223372036854775807,0] dilation=[18446744073709551615,1] groups=18446744073709551615\nreturn %1\n",
        "%x: f32[18446744073709551615] = input 0\n%1: f32[1] = cat %x, %x dim=0\nreturn %1\n",
        "%x: f32[4] = input 0\n%1: f32[1] = slice %x dim=0 start=18446744073709551615 step=1 len=1\nreturn %1\n",
        "%0: f32[2] = input 4294967296\nreturn %0\n",
    ] {
        assert!(matches!(parse(src), Err(kiln::Error::Parse { .. })), "{src}");
    }
}

#[test]
fn printing_invalid_graphs_does_not_panic() {
    let (mut g, x) = with_input();
    let a = g.add_unchecked(node(Op::Unary(UnaryOp::Neg), [2, 3], DType::F32), &[x]);
    g.set_operands(a, &[a]);
    let mut n = node(Op::Unary(UnaryOp::Neg), [2, 3], DType::F32);
    n.region = RegionId(9);
    let b = g.add_unchecked(n, &[a]);
    g.set_outputs(vec![b, x]);
    g.remove(x);
    g.set_outputs(vec![b, x]);
    snap(|| {
        insta::assert_snapshot!("text__print_invalid_graph", format!("{}---\n{}", print(&g), to_dot(&g)))
    });
}
