//! The shared fixture example: runs the attention of MiniLM-L6's first layer
//! (q/k/v [1, 145, 12, 32] float32, non-causal, default scale) through
//! flashattn in fp16 on the emulator and compares with the model's own
//! attention output (out.npy).
//!
//!   cargo run --example fixture_forward -- <repo>/tests/data/minilm_l6
//!
//! Prints the max abs error and PASS if max_abs <= 1e-2 * max(1, max|ref|);
//! exits non-zero otherwise.
use std::path::Path;
use std::process::ExitCode;

use flashattn::{Backend, Config, ForwardArgs, Runtime, Tensor, TensorMut};

/// A float32 C-order array read from a .npy file.
struct Npy {
    shape: Vec<usize>,
    data: Vec<f32>,
}

/// Reads a .npy file (format 1.0/2.0/3.0) holding little-endian float32 in C order.
fn read_npy(path: &Path) -> Result<Npy, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = |why: &str| format!("{}: {why}", path.display());
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("not a .npy file"));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        v => return Err(bad(&format!("unsupported .npy version {v}"))),
    };
    let header = bytes
        .get(start..start + header_len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| bad("truncated header"))?;
    // The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (...), }
    let value = |key: &str| -> Result<&str, String> {
        let at = header
            .find(&format!("'{key}':"))
            .ok_or_else(|| bad(&format!("no '{key}' in header")))?;
        Ok(header[at + key.len() + 3..].trim_start())
    };
    if !value("descr")?.starts_with("'<f4'") {
        return Err(bad("descr is not '<f4' (little-endian float32)"));
    }
    if !value("fortran_order")?.starts_with("False") {
        return Err(bad("fortran_order arrays are not supported"));
    }
    let shape_text = value("shape")?;
    let close = shape_text.find(')').ok_or_else(|| bad("bad shape"))?;
    let shape: Vec<usize> = shape_text[1..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad("bad shape")))
        .collect::<Result<_, _>>()?;
    let count: usize = shape.iter().product();
    let body = &bytes[start + header_len..];
    if body.len() != 4 * count {
        return Err(bad(&format!("{} data bytes for {count} float32 values", body.len())));
    }
    let data = body.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(Npy { shape, data })
}

fn run(dir: &Path) -> Result<bool, Box<dyn std::error::Error>> {
    let load = |name: &str| read_npy(&dir.join(name));
    let (q, k, v, want) = (load("q.npy")?, load("k.npy")?, load("v.npy")?, load("out.npy")?);
    for a in [&q, &k, &v, &want] {
        if a.shape != q.shape || a.shape.len() != 4 {
            return Err(format!("shapes differ: {:?} vs {:?}", a.shape, q.shape).into());
        }
    }
    let shape = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]]; // [1, 145, 12, 32]
    let (batch, seqlen, heads, head_dim) = (shape[0], shape[1], shape[2], shape[3]);

    let rt = Runtime::builder().backend(Backend::Emulator).build()?;
    let cfg =
        Config::builder().head_dim(head_dim as i32).heads(heads as i32, heads as i32).build()?;
    let qd = rt.alloc_from(&flashattn::f32_slice_to_f16(&q.data))?;
    let kd = rt.alloc_from(&flashattn::f32_slice_to_f16(&k.data))?;
    let vd = rt.alloc_from(&flashattn::f32_slice_to_f16(&v.data))?;
    let mut od = rt.alloc(2 * want.data.len())?;
    od.fill_bytes(0xff)?; // NaN poison: every element must be written
    let t0 = std::time::Instant::now();
    rt.forward(
        &cfg,
        ForwardArgs {
            batch,
            seqlen_q: seqlen,
            seqlen_k: seqlen,
            q: Tensor::contiguous(&qd, shape),
            k: Tensor::contiguous(&kd, shape),
            v: Tensor::contiguous(&vd, shape),
            o: TensorMut::contiguous(&mut od, shape),
            lse: None,
            workspace: None,
        },
    )?;
    let elapsed = t0.elapsed();
    let got = flashattn::f16_slice_to_f32(&od.to_vec::<u16>()?);

    let mut max_abs = 0f64;
    let mut max_ref = 0f64;
    for (&g, &w) in got.iter().zip(&want.data) {
        let err = if g.is_finite() { (g as f64 - w as f64).abs() } else { f64::INFINITY };
        max_abs = max_abs.max(err);
        max_ref = max_ref.max((w as f64).abs());
    }
    let bound = 1e-2 * max_ref.max(1.0);
    let info = rt.info()?;
    println!(
        "fixture {}: shape {:?}, {} (sm_{}), forward {:.1} ms",
        dir.display(),
        shape,
        info.device_name,
        info.sm,
        elapsed.as_secs_f64() * 1e3
    );
    println!("max abs error {max_abs:.3e} (bound {bound:.3e}, max |ref| {max_ref:.3})");
    Ok(max_abs <= bound)
}

fn main() -> ExitCode {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: fixture_forward <dir with q.npy k.npy v.npy out.npy>");
        return ExitCode::from(2);
    };
    match run(Path::new(&dir)) {
        Ok(true) => {
            println!("PASS");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("FAIL");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
