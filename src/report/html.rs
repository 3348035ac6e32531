//! The page: one self-contained HTML file (styles and script inline, no
//! fonts, no CDN), so a report opens offline in any browser, from any
//! machine. The script only shows and hides what the file already holds:
//! the pass selector, the tabs, and a panel for fused bodies.
//!
//! `#pass=N` in the URL opens pass N; `#selftest` makes the script click
//! through every pass and write what it saw into `#selftest` (what the
//! headless browser test reads).

use super::plan;
use super::svg::{self, fmt_ms};
use super::Report;
use std::fmt::Write;

/// Escapes text for HTML and SVG.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = r#"
body{font:14px system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:10px 16px;background:#263238;color:#eee}
header h1{font-size:18px;margin:0 0 4px 0}
header .notes{font-size:12px;color:#b0bec5}
nav.tabs{display:flex;gap:4px;padding:6px 16px;background:#eceff1;border-bottom:1px solid #cfd8dc}
nav.tabs button{border:1px solid #b0bec5;background:#fff;padding:4px 12px;cursor:pointer;border-radius:4px}
nav.tabs button.active{background:#1565c0;color:#fff;border-color:#1565c0}
.tab{display:none;padding:10px 16px}.tab.active{display:block}
#passes{display:flex;gap:12px}
#passlist{display:flex;flex-direction:column;gap:2px;min-width:190px}
#passlist button{text-align:left;border:1px solid #cfd8dc;background:#fff;padding:4px 8px;cursor:pointer;font:12px monospace;border-radius:3px}
#passlist button.active{background:#1565c0;color:#fff}
#passlist button .n{color:#90a4ae}#passlist button.active .n{color:#bbdefb}
.pass{display:none;flex:1;min-width:0}.pass.active{display:block}
.pass .stats{font:12px monospace;background:#fff;border:1px solid #cfd8dc;padding:6px}
.scroll{overflow:auto;max-height:72vh;border:1px solid #cfd8dc;background:#fff}
svg text{font:11px monospace;fill:#222}
svg.graph .node rect{fill:#fff;stroke:#455a64;stroke-width:1}
svg.graph .node.fused rect{fill:#e3f2fd;stroke:#1565c0;stroke-width:2;cursor:pointer}
svg.graph .node.input rect{fill:#f1f8e9;stroke:#558b2f}
svg.graph .node.const rect{fill:#fffde7;stroke:#9e9d24}
svg.graph .node.view rect{stroke-dasharray:4 2}
svg.graph .node.output rect{stroke:#c62828;stroke-width:2.5}
svg.graph .node text.l1{fill:#546e7a}svg.graph .node text.l2{fill:#bf360c;font-weight:bold}
svg.graph .edge path{fill:none;stroke:#90a4ae;stroke-width:1.2}
svg.graph .edge text{font-size:9px;fill:#78909c}
svg.graph .cluster polygon{fill:rgba(103,58,183,.05);stroke:#9575cd;stroke-dasharray:5 3}
svg.graph .cluster text{fill:#5e35b1;font-weight:bold}
pre{font:12px monospace;background:#fff;border:1px solid #cfd8dc;padding:8px;overflow:auto;max-height:60vh}
pre.diff .add{color:#1b5e20;background:#e8f5e9;display:block}pre.diff .del{color:#b71c1c;background:#ffebee;display:block}
pre.diff .hunk{color:#6a1b9a;display:block}
table{border-collapse:collapse;font:12px monospace;background:#fff}
td,th{border:1px solid #cfd8dc;padding:2px 6px;text-align:left}th{background:#eceff1}
td.num{text-align:right}
svg.lanes .lane{fill:#f5f5f5;stroke:#cfd8dc}
svg.lanes .step rect{fill:#90caf9;stroke:#1565c0;stroke-width:.5}
svg.lanes .step.fused rect{fill:#64b5f6}svg.lanes .step.ready rect{fill:#dcedc8}svg.lanes .step.view rect{fill:#eeeeee}
svg.lanes .event{stroke:#d84315;stroke-width:1.5}
svg.arena .frame{fill:#fff;stroke:#90a4ae}svg.arena .value rect{stroke:#37474f;stroke-width:.4}
svg.arena .bound{stroke:#c62828;stroke-dasharray:6 3;fill:#c62828}
#bodyview{display:none;position:fixed;right:16px;top:60px;max-width:60vw;max-height:80vh;overflow:auto;background:#fff;border:2px solid #1565c0;box-shadow:0 4px 16px rgba(0,0,0,.3);padding:8px;z-index:5}
#bodyview.open{display:block}
#bodyview button{float:right}
.hidden{display:none}
p.totals{font:13px monospace}
p.help{color:#546e7a;font-size:13px;max-width:70em;margin:4px 0 10px 0}
"#;

const SCRIPT: &str = r#"
(function(){
  var errors=[];
  window.addEventListener('error',function(e){errors.push(String(e.message));});
  function all(sel){return Array.prototype.slice.call(document.querySelectorAll(sel));}
  function tab(name){
    all('nav.tabs button').forEach(function(b){b.classList.toggle('active',b.dataset.tab===name);});
    all('.tab').forEach(function(t){t.classList.toggle('active',t.id==='tab-'+name);});
  }
  function pass(k){
    all('#passlist button').forEach(function(b){b.classList.toggle('active',b.dataset.pass===String(k));});
    all('.pass').forEach(function(p){p.classList.toggle('active',p.id==='pass-'+k);});
  }
  all('nav.tabs button').forEach(function(b){b.addEventListener('click',function(){tab(b.dataset.tab);});});
  all('#passlist button').forEach(function(b){b.addEventListener('click',function(){pass(b.dataset.pass);});});
  var view=document.getElementById('bodyview');
  document.addEventListener('click',function(e){
    var g=e.target.closest&&e.target.closest('[data-body]');
    if(!g)return;
    var src=document.getElementById(g.dataset.body);
    if(!src)return;
    view.querySelector('.content').innerHTML=src.innerHTML;
    view.querySelector('.title').textContent='body of %'+g.dataset.node;
    view.classList.add('open');
  });
  view.querySelector('button').addEventListener('click',function(){view.classList.remove('open');});
  var buttons=all('#passlist button');
  var m=/pass=(\d+)/.exec(location.hash);
  pass(m?m[1]:(buttons.length?buttons[buttons.length-1].dataset.pass:0));
  var t=/tab=(\w+)/.exec(location.hash); if(t)tab(t[1]);
  if(/selftest/.test(location.hash)){
    var seen=[],ok=true,prev=null;
    buttons.forEach(function(b){
      b.click();
      var shown=all('.pass.active');
      var svg=shown.length===1?shown[0].querySelector('svg'):null;
      var good=shown.length===1&&shown[0].id==='pass-'+b.dataset.pass&&svg!==null&&svg!==prev;
      if(!good)ok=false;
      seen.push(b.dataset.pass+':'+(good?'shown':'wrong'));
      prev=svg;
    });
    var fused=document.querySelector('.pass.active [data-body]');
    if(fused){fused.dispatchEvent(new MouseEvent('click',{bubbles:true}));if(!view.classList.contains('open'))ok=false;seen.push('body:'+(view.classList.contains('open')?'open':'closed'));}
    var out=document.getElementById('selftest');
    out.textContent='selftest '+(ok&&errors.length===0?'ok':'failed')+' passes='+buttons.length+' '+seen.join(' ')+(errors.length?' errors: '+errors.join(' | '):'');
  }
})();
"#;

/// The whole page.
pub(crate) fn page(r: &Report) -> String {
    let mut out = String::with_capacity(1 << 16);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>\n",
        esc(&r.title)
    );
    let _ = write!(out, "<header><h1>{}</h1><div class=\"notes\">device: {}", esc(&r.title), esc(&r.device));
    for n in &r.notes {
        let _ = write!(out, " · {}", esc(n));
    }
    out.push_str("</div></header>\n");
    out.push_str("<nav class=\"tabs\"><button data-tab=\"passes\" class=\"active\">Passes</button><button data-tab=\"plan\">Plan</button><button data-tab=\"memory\">Memory</button><button data-tab=\"kernels\">Kernels</button><button data-tab=\"profile\">Profile</button></nav>\n");
    let times = r.profile.as_ref().map(|p| &p.times);
    // Passes.
    out.push_str("<div class=\"tab active\" id=\"tab-passes\"><p class=\"help\">The graph after each step of the pipeline: pick a step on the left. Boxes are values (<b>%n</b> as in the text IR, op, type); edges carry the shape they pass; dashed outlines are regions (scopes); blue boxes are fused kernels (click one for its body); the red-edged box is an output; with profiling on, the last step shows each node's time. Below: the pass's stats, the diff from the step before, the text IR.</p><div id=\"passes\"><div id=\"passlist\">\n");
    for s in &r.steps {
        let _ = writeln!(
            out,
            "<button data-pass=\"{}\"><span class=\"n\">{:02}</span> {} <span class=\"n\">({})</span></button>",
            s.step,
            s.step,
            esc(&s.name),
            s.nodes
        );
    }
    out.push_str("</div>\n");
    let last = r.steps.len().saturating_sub(1);
    for (k, s) in r.steps.iter().enumerate() {
        let prev = if k == 0 { None } else { Some(&r.steps[k - 1]) };
        let drawing = svg::draw(&s.graph, &format!("p{}", s.step), if k == last { times } else { None });
        let _ = write!(
            out,
            "<section class=\"pass\" id=\"pass-{}\"><h2>{:02} {}</h2><div class=\"stats\">{}</div>\n<div class=\"scroll\">{}</div>\n",
            s.step,
            s.step,
            esc(&s.name),
            esc(&s.header),
            drawing.svg
        );
        // Body drawings live outside the SVG, keyed by id, for the panel.
        for (n, body) in &drawing.bodies {
            let _ = writeln!(out, "<div class=\"hidden\" id=\"p{}-body-{n}\">{body}</div>", s.step);
        }
        match prev {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "<h3>Diff from {:02} {}</h3><pre class=\"diff\">{}</pre>",
                    p.step,
                    esc(&p.name),
                    diff(&p.text, &s.text)
                );
            }
            None => out.push_str("<h3>Diff</h3><p>The first step: nothing to compare with.</p>\n"),
        }
        let _ = writeln!(
            out,
            "<details><summary>Text IR</summary><pre>{}</pre></details></section>",
            esc(&s.text)
        );
    }
    out.push_str("</div></div>\n");
    // Plan.
    let final_graph = r.steps.last().map(|s| &s.graph);
    out.push_str("<div class=\"tab\" id=\"tab-plan\"><h2>Plan</h2><p class=\"help\">The order the backend runs the nodes in. Each stream is a lane (hover a step for its node); red lines are events, from the node they are recorded after to the node on another stream that waits for them.</p>\n");
    if let Some(g) = final_graph {
        out.push_str(&plan::section(g, times));
    }
    out.push_str("</div>\n");
    // Memory.
    out.push_str(
        "<div class=\"tab\" id=\"tab-memory\"><h2>Memory</h2><p class=\"help\">Every value a plan computes lives in one arena: a block spans the schedule steps its value is live (x) and the bytes it holds (y); hover one for its node. The dashed line is the lower bound: the most bytes live at one step, which no layout can beat.</p><h3>Arena (offset × schedule step)</h3>\n",
    );
    if let Some(g) = final_graph {
        out.push_str(&plan::arena(g));
    }
    out.push_str(&persistent(r));
    out.push_str("</div>\n");
    // Kernels.
    out.push_str("<div class=\"tab\" id=\"tab-kernels\"><h2>Kernels</h2><p class=\"help\">What each fused node runs: on CUDA the generated CUDA C (and the cuBLAS/cuDNN calls), on the CPU the fused body, which the backend runs as one blocked loop. Click a name to open it.</p>\n");
    if r.kernels.is_empty() {
        out.push_str("<p>No kernels: the plan has no fused node (and no generated source).</p>\n");
    }
    for k in &r.kernels {
        let nodes: Vec<String> = k.nodes.iter().map(|n| format!("%{n}")).collect();
        let _ = writeln!(
            out,
            "<details><summary>{} <small>({}, {})</small></summary><pre>{}</pre></details>",
            esc(&k.name),
            k.language,
            nodes.join(" "),
            esc(&k.source)
        );
    }
    out.push_str("</div>\n");
    // Profile.
    out.push_str("<div class=\"tab\" id=\"tab-profile\"><h2>Profile</h2>\n");
    match &r.profile {
        Some(p) => {
            let _ = writeln!(
                out,
                "<p>{} run(s), {} in all; node times add up to {}.</p><pre>{}</pre>",
                p.runs,
                fmt_ms(p.wall_ms),
                fmt_ms(p.node_ms),
                esc(&p.table)
            );
        }
        None => out.push_str(
            "<p>No times: profiling was off. Turn it on with <code>ctx.with_profiling(true)</code> or <code>KILN_TRACE=trace.json</code>.</p>\n",
        ),
    }
    out.push_str("</div>\n");
    out.push_str("<div id=\"bodyview\"><button>close</button><b class=\"title\"></b><div class=\"content\"></div></div>\n<pre id=\"selftest\" class=\"hidden\"></pre>\n");
    let _ = write!(out, "<script>{SCRIPT}</script>\n</body></html>\n");
    out
}

/// Persistent buffers (variables) by scope: the workspace as a table.
fn persistent(r: &Report) -> String {
    let mut out = String::from("<h3>Persistent buffers by scope</h3>\n");
    if r.persistent.is_empty() {
        out.push_str("<p>No variables (or the report was made from a dump).</p>\n");
        return out;
    }
    let mut scopes: std::collections::BTreeMap<&str, Vec<&crate::VariableInfo>> = Default::default();
    for v in &r.persistent {
        scopes.entry(v.region.as_str()).or_default().push(v);
    }
    out.push_str(
        "<table><tr><th>scope</th><th>variable</th><th>type</th><th>bytes</th><th>state</th></tr>\n",
    );
    for (scope, vars) in scopes {
        let total: usize = vars.iter().map(|v| v.bytes).sum();
        let _ = writeln!(
            out,
            "<tr><th colspan=\"3\">{}</th><th class=\"num\">{}</th><th></th></tr>",
            esc(if scope.is_empty() { "(root)" } else { scope }),
            plan::bytes(total as u64)
        );
        for v in vars {
            let state = match (v.pending, v.has_grad) {
                (true, true) => "pending, grad",
                (true, false) => "pending",
                (false, true) => "grad",
                (false, false) => "",
            };
            let _ = writeln!(
                out,
                "<tr><td></td><td>{}</td><td>{}{}</td><td class=\"num\">{}</td><td>{state}</td></tr>",
                esc(&v.name),
                v.dtype,
                crate::ir::Shape::new(v.shape.clone()),
                v.bytes
            );
        }
    }
    out.push_str("</table>\n");
    out
}

/// A unified diff of two texts, as coloured HTML lines.
fn diff(old: &str, new: &str) -> String {
    if old == new {
        return "(no change)".into();
    }
    let d = similar::TextDiff::from_lines(old, new);
    let mut out = String::new();
    for hunk in d.unified_diff().context_radius(3).iter_hunks() {
        let _ = writeln!(out, "<span class=\"hunk\">{}</span>", esc(&hunk.header().to_string()));
        for change in hunk.iter_changes() {
            let (class, sign) = match change.tag() {
                similar::ChangeTag::Delete => ("del", '-'),
                similar::ChangeTag::Insert => ("add", '+'),
                similar::ChangeTag::Equal => ("", ' '),
            };
            let line = change.value().trim_end_matches('\n');
            if class.is_empty() {
                let _ = writeln!(out, "{sign}{}", esc(line));
            } else {
                let _ = write!(out, "<span class=\"{class}\">{sign}{}</span>", esc(line));
            }
        }
    }
    out
}
