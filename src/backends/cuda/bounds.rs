//! [`Program::check`]: every index a lowered program holds is in range and
//! every location lies inside its region, so an executor that trusts the
//! program (the CUDA backend, the emulator) never indexes a stream, event
//! or kernel that does not exist (a panic mid-capture) or hands a library
//! a pointer past its memory.
//!
//! Library calls (GEMMs, convolutions, poolings) describe their operands
//! completely, so their whole extent is checked. A generated kernel's
//! extent is in its source: its arguments are checked to start inside
//! their regions, and the plan check before lowering (`backends/check.rs`)
//! is what bounds the values they index.

use super::program::{Launch, Loc, Output, Program, Region, Tensor4};

impl Program {
    /// Bytes of `region`, or `None` for a region the program does not have.
    fn region_bytes(&self, region: Region) -> Option<u64> {
        match region {
            Region::Arena => Some(self.arena_bytes),
            Region::Scratch => Some(self.scratch_bytes),
            Region::Transient(s) => self.transient_bytes.get(s as usize).copied(),
            Region::Params => Some(self.params_bytes),
            Region::Counters => Some(self.counter_bytes),
            Region::Input(k) => {
                self.inputs.get(k as usize)?.as_ref().map(|(s, d)| s.numel() as u64 * d.size() as u64)
            }
            Region::Out(k) => self.out_slots.get(k as usize).copied(),
        }
    }

    /// `bytes` bytes at `at` lie inside its region.
    fn inside(&self, at: Loc, bytes: u64, what: &str) -> Result<(), String> {
        let size =
            self.region_bytes(at.region).ok_or_else(|| format!("{what} is in {at}, which does not exist"))?;
        match at.offset.checked_add(bytes) {
            Some(end) if end <= size => Ok(()),
            _ => Err(format!("{what}: {bytes} bytes at {at} end past the region's {size} bytes")),
        }
    }

    /// Checks the program (see the module docs).
    pub fn check(&self) -> Result<(), String> {
        if self.streams == 0 {
            return Err("the program has no streams".into());
        }
        for j in &self.prelude {
            self.check_launch(j, "the prelude")?;
        }
        for step in &self.steps {
            let at = format!("{} ({})", step.node, step.op);
            if step.stream >= self.streams {
                return Err(format!("{at} runs on stream {} of {}", step.stream, self.streams));
            }
            if let Some(e) = step.waits.iter().chain(&step.records).find(|&&e| e >= self.events) {
                return Err(format!("{at} uses event {e} of {}", self.events));
            }
            for l in &step.launches {
                self.check_launch(l, &at)?;
            }
        }
        for (i, o) in self.outputs.iter().enumerate() {
            let ok = match o {
                Output::Input { k, .. } | Output::OverInput { k, .. } => (*k as usize) < self.inputs.len(),
                Output::Slot { slot, shape, dtype } => self
                    .out_slots
                    .get(*slot as usize)
                    .is_some_and(|&b| b >= shape.numel() as u64 * dtype.size() as u64),
            };
            if !ok {
                return Err(format!("output {i} ({o:?}) is not a region of the program"));
            }
        }
        for c in &self.checks {
            self.inside(Loc::new(Region::Params, c.status), 16, "an index check's status")?;
        }
        let rng = 8 * (1 + self.random_streams as u64);
        if rng > self.params_bytes {
            return Err(format!("{} random streams do not fit the parameter block", self.random_streams));
        }
        Ok(())
    }

    fn check_launch(&self, l: &Launch, at: &str) -> Result<(), String> {
        match l {
            Launch::Kernel { kernel, args } => {
                if *kernel >= self.kernels.len() {
                    return Err(format!("{at} launches kernel {kernel} of {}", self.kernels.len()));
                }
                for a in args {
                    self.inside(*a, 0, &format!("{at}: an argument of {}", self.kernels[*kernel].name))?;
                }
            }
            Launch::Gemm(g) => {
                let size = g.dtype.size() as u64;
                let matrix = |(loc, ld, stride): (Loc, usize, usize),
                              rows: usize,
                              cols: usize,
                              size: u64,
                              what: &str| {
                    if rows == 0 || cols == 0 || g.batch == 0 {
                        return self.inside(loc, 0, what);
                    }
                    let last =
                        (g.batch - 1) as u64 * stride as u64 + (cols - 1) as u64 * ld as u64 + rows as u64;
                    if ld < rows {
                        return Err(format!("{at}: {what} has leading dimension {ld} below its {rows} rows"));
                    }
                    self.inside(loc, last * size, &format!("{at}: GEMM {what}"))
                };
                let (ra, ca) = if g.transa { (g.k, g.m) } else { (g.m, g.k) };
                let (rb, cb) = if g.transb { (g.n, g.k) } else { (g.k, g.n) };
                matrix(g.a, ra, ca, size, "A")?;
                matrix(g.b, rb, cb, size, "B")?;
                matrix(g.c, g.m, g.n, g.out_dtype.size() as u64, "C")?;
                if let Some(b) = g.epilogue.bias() {
                    self.inside(b, g.m as u64 * size, &format!("{at}: the GEMM's bias"))?;
                }
            }
            Launch::Conv(c) => {
                let size = c.dtype.size() as u64;
                for (t, what) in [(&c.x, "input"), (&c.w, "filter"), (&c.y, "output")] {
                    self.tensor4(t, size, &format!("{at}: the convolution's {what}"))?;
                }
            }
            Launch::Pool(p) => {
                let size = p.dtype.size() as u64;
                self.tensor4(&p.x, size, &format!("{at}: the pooling's input"))?;
                self.tensor4(&p.y, size, &format!("{at}: the pooling's output"))?;
            }
            Launch::Collective(c) => {
                let size = c.dtype.size() as u64;
                let result = c.what.result_count(c.count) as u64 * size;
                self.inside(c.src, c.count as u64 * size, &format!("{at}: the collective's operand"))?;
                self.inside(c.dst, result, &format!("{at}: the collective's result"))?;
            }
        }
        Ok(())
    }

    fn tensor4(&self, t: &Tensor4, size: u64, what: &str) -> Result<(), String> {
        if t.dims.contains(&0) {
            return self.inside(t.at, 0, what);
        }
        let last: u64 =
            t.dims.iter().zip(&t.strides).map(|(&d, &s)| (d as u64 - 1) * s as u64).sum::<u64>() + 1;
        self.inside(t.at, last * size, what)
    }
}

#[cfg(test)]
mod tests {
    use super::super::lower;
    use crate::backends::cuda::program::{Launch, Program, Region};
    use crate::ir::Plan;

    fn program() -> Program {
        let g = crate::ir::text::parse(
            "%a: f32[3,5] = input 0\n%w: f32[5,4] = input 1\n%y: f32[3,4] = matmul %a, %w\n%z: f32[3,4] = tanh %y\nreturn %z\n",
        )
        .expect("parses");
        lower(&Plan::new(g), false).expect("lowers")
    }

    fn launches(p: &mut Program) -> impl Iterator<Item = &mut Launch> {
        p.steps.iter_mut().flat_map(|s| s.launches.iter_mut())
    }

    #[test]
    fn a_lowered_program_checks() {
        assert_eq!(program().check(), Ok(()));
    }

    #[test]
    fn out_of_range_streams_events_kernels_and_locations_are_refused() {
        let mut p = program();
        p.steps[0].stream = 3;
        assert!(p.check().unwrap_err().contains("runs on stream 3 of 1"), "{:?}", p.check());
        let mut p = program();
        p.steps[0].waits.push(0);
        assert!(p.check().unwrap_err().contains("uses event 0 of 0"));
        let mut p = program();
        for l in launches(&mut p) {
            if let Launch::Kernel { kernel, .. } = l {
                *kernel = 9;
            }
        }
        assert!(p.check().unwrap_err().contains("launches kernel 9"));
        let mut p = program();
        for l in launches(&mut p) {
            if let Launch::Kernel { args, .. } = l {
                args[0].region = Region::Out(7);
            }
        }
        assert!(p.check().unwrap_err().contains("out7+0, which does not exist"));
    }

    #[test]
    fn a_gemm_reaching_past_its_region_is_refused() {
        let mut p = program();
        let end = p.arena_bytes.max(p.scratch_bytes);
        for l in launches(&mut p) {
            if let Launch::Gemm(g) = l {
                g.c.0.offset = end;
            }
        }
        let e = p.check().unwrap_err();
        assert!(e.contains("GEMM C") && e.contains("end past the region"), "{e}");
        let mut p = program();
        for l in launches(&mut p) {
            if let Launch::Gemm(g) = l {
                g.batch = 2;
            }
        }
        assert!(p.check().unwrap_err().contains("end past the region"));
    }
}
