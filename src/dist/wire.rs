//! The messages ranks of a group of processes exchange with the group's
//! coordinator (`coordinator.rs`, served by rank 0), and how they are
//! framed on a TCP stream.
//!
//! A frame is a little-endian `u64` length, then that many bytes: a tag
//! byte and the message's fields. Strings and byte strings carry a `u64`
//! length; a tensor carries its dtype (a tag byte), its element count and
//! its elements, little-endian. Nothing here trusts the peer: any port
//! scanner may connect, so a short, oversized or malformed frame is an
//! error naming what was wrong, never a panic or an allocation of what the
//! peer claims.

use crate::ir::{Collective, HostData, ReduceOp, Shape};
use std::io::{Read, Write};

/// The first bytes of every `Hello`: what tells a kiln rank from anything
/// else that connects to the port, and which protocol it speaks.
pub(crate) const MAGIC: &[u8; 8] = b"kiln-d01";

/// The largest frame accepted (a gradient bucket is far smaller).
const MAX_FRAME: u64 = 1 << 36;

/// One message (see the module docs for who sends which).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Msg {
    /// Rank to coordinator, first: who it is. `payload` is rank 0's to
    /// hand to every rank (the NCCL unique id), empty on the others.
    Hello { rank: u64, size: u64, kind: String, device: String, pid: u32, payload: Vec<u8> },
    /// Coordinator to rank, once every rank said hello: rank 0's payload.
    Welcome { payload: Vec<u8> },
    /// Coordinator to rank: the group cannot form, and why.
    Refused { why: String },
    /// Rank to coordinator: its operand of its collective number `seq`.
    Part { seq: u64, what: Collective, shape: Shape, data: HostData },
    /// Coordinator to rank: the result of collective `seq`.
    Result { seq: u64, data: HostData },
    /// Either way: the group is broken, and why (the first reason sticks).
    Break { why: String },
    /// Rank to coordinator: this rank is done and leaves the group.
    Bye,
}

/// Writes `msg` as one frame.
pub(crate) fn write(w: &mut impl Write, msg: &Msg) -> std::io::Result<()> {
    match msg {
        Msg::Part { seq, what, shape, data } => write_part(w, *seq, *what, shape, data),
        Msg::Result { seq, data } => write_result(w, *seq, data),
        _ => send(w, Vec::with_capacity(64), |b| match msg {
            Msg::Hello { rank, size, kind, device, pid, payload } => {
                b.push(1);
                b.extend_from_slice(MAGIC);
                b.extend_from_slice(&rank.to_le_bytes());
                b.extend_from_slice(&size.to_le_bytes());
                bytes(b, kind.as_bytes());
                bytes(b, device.as_bytes());
                b.extend_from_slice(&pid.to_le_bytes());
                bytes(b, payload);
            }
            Msg::Welcome { payload } => {
                b.push(2);
                bytes(b, payload);
            }
            Msg::Refused { why } => {
                b.push(3);
                bytes(b, why.as_bytes());
            }
            Msg::Break { why } => {
                b.push(6);
                bytes(b, why.as_bytes());
            }
            _ => b.push(7),
        }),
    }
}

/// Writes a [`Msg::Part`] from borrowed fields.
pub(crate) fn write_part(
    w: &mut impl Write,
    seq: u64,
    what: Collective,
    shape: &Shape,
    data: &HostData,
) -> std::io::Result<()> {
    send(w, Vec::with_capacity(64 + data.len() * data.dtype().size()), |b| {
        b.push(4);
        b.extend_from_slice(&seq.to_le_bytes());
        let (kind, arg) = match what {
            Collective::AllReduce(op) => (0u8, reduce_tag(op) as u64),
            Collective::Broadcast(root) => (1u8, root as u64),
            Collective::ReduceScatter { op, ranks } => (2u8, (ranks as u64) << 8 | reduce_tag(op) as u64),
            Collective::AllGather { ranks } => (3u8, ranks as u64),
        };
        b.push(kind);
        b.extend_from_slice(&arg.to_le_bytes());
        b.extend_from_slice(&(shape.rank() as u64).to_le_bytes());
        for &d in shape.dims() {
            b.extend_from_slice(&(d as u64).to_le_bytes());
        }
        tensor(b, data);
    })
}

/// Writes a [`Msg::Result`] from borrowed fields (one result, sent to
/// every rank, is encoded from the shared copy).
pub(crate) fn write_result(w: &mut impl Write, seq: u64, data: &HostData) -> std::io::Result<()> {
    send(w, Vec::with_capacity(32 + data.len() * data.dtype().size()), |b| {
        b.push(5);
        b.extend_from_slice(&seq.to_le_bytes());
        tensor(b, data);
    })
}

/// Frames what `fill` writes after the length, and writes it.
fn send(w: &mut impl Write, mut b: Vec<u8>, fill: impl FnOnce(&mut Vec<u8>)) -> std::io::Result<()> {
    b.extend_from_slice(&[0; 8]);
    fill(&mut b);
    let len = (b.len() - 8) as u64;
    b[..8].copy_from_slice(&len.to_le_bytes());
    w.write_all(&b)?;
    w.flush()
}

/// Reads one frame. `Ok(None)` is the peer closing the stream between
/// frames; an error is anything else (a reset, a frame cut short, a
/// malformed one).
pub(crate) fn read(r: &mut impl Read) -> std::io::Result<Option<Msg>> {
    let mut len = [0u8; 8];
    match r.read(&mut len[..1])? {
        0 => return Ok(None),
        _ => r.read_exact(&mut len[1..])?,
    }
    let len = u64::from_le_bytes(len);
    if len == 0 || len > MAX_FRAME {
        return Err(bad(format!("a frame of {len} bytes (at most {MAX_FRAME})")));
    }
    // Read in steps, so a peer that claims a large frame and sends less
    // costs what it sent, not what it claimed.
    let mut buf = Vec::new();
    r.take(len).read_to_end(&mut buf)?;
    if buf.len() as u64 != len {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "a frame cut short"));
    }
    let mut c = Cursor { b: &buf, at: 1 };
    let msg = match buf[0] {
        1 => {
            if c.take(MAGIC.len())? != MAGIC {
                return Err(bad("a hello that is not from a kiln rank of this version".into()));
            }
            Msg::Hello {
                rank: c.u64()?,
                size: c.u64()?,
                kind: c.string()?,
                device: c.string()?,
                pid: u32::from_le_bytes(c.array()?),
                payload: c.bytes()?.to_vec(),
            }
        }
        2 => Msg::Welcome { payload: c.bytes()?.to_vec() },
        3 => Msg::Refused { why: c.string()? },
        4 => {
            let seq = c.u64()?;
            let kind = c.take(1)?[0];
            let arg = c.u64()?;
            let what = match kind {
                0 => Collective::AllReduce(reduce_op(arg)?),
                1 => Collective::Broadcast(u32::try_from(arg).map_err(|_| bad(format!("root {arg}")))?),
                2 => Collective::ReduceScatter {
                    op: reduce_op(arg & 0xff)?,
                    ranks: u32::try_from(arg >> 8).map_err(|_| bad(format!("ranks {}", arg >> 8)))?,
                },
                3 => Collective::AllGather {
                    ranks: u32::try_from(arg).map_err(|_| bad(format!("ranks {arg}")))?,
                },
                k => return Err(bad(format!("collective kind {k}"))),
            };
            let rank = c.u64()?;
            if rank > 64 {
                return Err(bad(format!("a shape of rank {rank}")));
            }
            let dims = (0..rank).map(|_| c.u64().map(|d| d as usize)).collect::<std::io::Result<Vec<_>>>()?;
            Msg::Part { seq, what, shape: Shape::new(dims), data: c.tensor()? }
        }
        5 => Msg::Result { seq: c.u64()?, data: c.tensor()? },
        6 => Msg::Break { why: c.string()? },
        7 => Msg::Bye,
        t => return Err(bad(format!("message tag {t}"))),
    };
    if c.at != buf.len() {
        return Err(bad(format!("{} trailing byte(s) after a message", buf.len() - c.at)));
    }
    Ok(Some(msg))
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed frame: {what}"))
}

fn bytes(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

fn reduce_tag(op: ReduceOp) -> u8 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Mean => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::ArgMax => 4,
    }
}

fn reduce_op(tag: u64) -> std::io::Result<ReduceOp> {
    Ok(match tag {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Mean,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        4 => ReduceOp::ArgMax,
        t => return Err(bad(format!("reduce op {t}"))),
    })
}

/// The dtype tag, the element count, the elements (little-endian).
fn tensor(b: &mut Vec<u8>, data: &HostData) {
    macro_rules! put {
        ($tag:expr, $v:expr, $bits:expr) => {{
            b.push($tag);
            b.extend_from_slice(&($v.len() as u64).to_le_bytes());
            for x in $v {
                b.extend_from_slice(&$bits(x).to_le_bytes());
            }
        }};
    }
    match data {
        HostData::F16(v) => put!(0, v, |x: &half::f16| x.to_bits()),
        HostData::BF16(v) => put!(1, v, |x: &half::bf16| x.to_bits()),
        HostData::F32(v) => put!(2, v, |x: &f32| x.to_bits()),
        HostData::F64(v) => put!(3, v, |x: &f64| x.to_bits()),
        HostData::U8(v) => put!(4, v, |x: &u8| *x),
        HostData::I32(v) => put!(5, v, |x: &i32| *x),
        HostData::I64(v) => put!(6, v, |x: &i64| *x),
        HostData::Bool(v) => put!(7, v, |x: &bool| *x as u8),
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> std::io::Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| bad(format!("{n} byte(s) wanted, {} left", self.b.len() - self.at)))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u64(&mut self) -> std::io::Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn bytes(&mut self) -> std::io::Result<&'a [u8]> {
        let n = self.u64()?;
        self.take(usize::try_from(n).map_err(|_| bad(format!("a length of {n}")))?)
    }

    fn string(&mut self) -> std::io::Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| bad("a string that is not UTF-8".into()))
    }

    fn tensor(&mut self) -> std::io::Result<HostData> {
        let tag = self.take(1)?[0];
        let n = self.u64()?;
        let width: u64 = match tag {
            0 | 1 => 2,
            2 | 5 => 4,
            3 | 6 => 8,
            4 | 7 => 1,
            t => return Err(bad(format!("dtype tag {t}"))),
        };
        let len = n.checked_mul(width).and_then(|l| usize::try_from(l).ok());
        let raw = self.take(len.ok_or_else(|| bad(format!("{n} elements")))?)?;
        macro_rules! get {
            ($variant:ident, $w:expr, $from:expr) => {
                HostData::$variant(
                    raw.chunks_exact($w).map(|c| $from(c.try_into().unwrap_or([0; $w]))).collect(),
                )
            };
        }
        Ok(match tag {
            0 => get!(F16, 2, |c| half::f16::from_bits(u16::from_le_bytes(c))),
            1 => get!(BF16, 2, |c| half::bf16::from_bits(u16::from_le_bytes(c))),
            2 => get!(F32, 4, |c| f32::from_bits(u32::from_le_bytes(c))),
            3 => get!(F64, 8, |c| f64::from_bits(u64::from_le_bytes(c))),
            4 => get!(U8, 1, |c: [u8; 1]| c[0]),
            5 => get!(I32, 4, i32::from_le_bytes),
            6 => get!(I64, 8, i64::from_le_bytes),
            _ => get!(Bool, 1, |c: [u8; 1]| c[0] != 0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read back, the message prints the same and writes the same bytes
    /// (bit for bit: a NaN's payload too, which `==` cannot tell).
    fn round_trip(msg: Msg) {
        let mut b = Vec::new();
        write(&mut b, &msg).unwrap();
        let mut r = &b[..];
        let back = read(&mut r).unwrap().unwrap();
        assert_eq!(format!("{back:?}"), format!("{msg:?}"));
        let mut again = Vec::new();
        write(&mut again, &back).unwrap();
        assert_eq!(again, b);
        assert_eq!(read(&mut r).unwrap(), None, "the stream ends after one frame");
    }

    #[test]
    fn every_message_round_trips_bit_for_bit() {
        round_trip(Msg::Hello {
            rank: 3,
            size: 4,
            kind: "cuda".into(),
            device: "cuda:1".into(),
            pid: 77,
            payload: vec![9; 128],
        });
        round_trip(Msg::Welcome { payload: vec![] });
        round_trip(Msg::Refused { why: "no".into() });
        round_trip(Msg::Break { why: "rank 1 died".into() });
        round_trip(Msg::Bye);
        let nan = f32::from_bits(0x7fc0_1234);
        round_trip(Msg::Part {
            seq: 5,
            what: Collective::AllReduce(ReduceOp::Mean),
            shape: Shape::new([2, 2]),
            data: HostData::F32(vec![-0.0, nan, 1e-45, f32::INFINITY]),
        });
        round_trip(Msg::Part {
            seq: 6,
            what: Collective::ReduceScatter { op: ReduceOp::Mean, ranks: 3 },
            shape: Shape::new([3]),
            data: HostData::F32(vec![1.0, 2.0, 3.0]),
        });
        round_trip(Msg::Part {
            seq: 7,
            what: Collective::AllGather { ranks: 2 },
            shape: Shape::new([1]),
            data: HostData::I64(vec![-4]),
        });
        round_trip(Msg::Part {
            seq: u64::MAX,
            what: Collective::Broadcast(7),
            shape: Shape::new([]),
            data: HostData::BF16(vec![half::bf16::from_f32(1.5)]),
        });
        for data in [
            HostData::F16(vec![half::f16::from_f32(-2.0)]),
            HostData::F64(vec![1.0 / 3.0, -0.0]),
            HostData::U8(vec![0, 255]),
            HostData::I32(vec![i32::MIN]),
            HostData::I64(vec![i64::MAX, -1]),
            HostData::Bool(vec![true, false]),
        ] {
            round_trip(Msg::Result { seq: 1, data });
        }
    }

    #[test]
    fn a_stranger_or_a_bad_frame_is_an_error_not_a_panic() {
        let err = |bytes: &[u8]| read(&mut &bytes[..]).unwrap_err().to_string();
        // Claims 2^40 bytes: refused before reading them.
        assert!(err(&(1u64 << 40).to_le_bytes()).contains("a frame of 1099511627776 bytes"));
        // An HTTP request's first 8 bytes read as a length.
        assert!(err(b"GET / HTTP/1.1\r\n\r\n").contains("malformed frame"));
        // A frame cut short.
        assert!(err(&[5, 0, 0, 0, 0, 0, 0, 0, 5]).contains("cut short"));
        // A result claiming more elements than it carries.
        let mut b = vec![0u8; 8];
        b.push(5);
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(2);
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        let len = (b.len() - 8) as u64;
        b[..8].copy_from_slice(&len.to_le_bytes());
        assert!(err(&b).contains("18446744073709551615 elements"), "{}", err(&b));
        // A hello without the magic.
        let mut h = vec![0u8; 8];
        h.push(1);
        h.extend_from_slice(b"kiln-x99");
        let len = (h.len() - 8) as u64;
        h[..8].copy_from_slice(&len.to_le_bytes());
        assert!(err(&h).contains("not from a kiln rank of this version"));
    }
}
