//! The persistent sm_90a forward's dynamic scheduling (C API 0.8:
//! `ForwardArgs::workspace`, `Runtime::forward_workspace_size`) on an
//! emulated sm_90. The kernel policy (FLASHATTN_SM90_PERSISTENT) is read
//! when a runtime is built, so this binary's one test builds a runtime with
//! the variable set and one without, nothing else running. The problem has
//! 160 work items (5 batches x 32 query heads x one m-block) on the
//! emulator's 108 SMs: CTAs take their second item from the workspace's
//! counter, so a workspace that is not zero skips items.
mod common;

use common::{
    check_lse, f16_qkv, forward_contiguous_ws, max_abs_err, problem_config, reference, Problem,
    F16_TOL,
};
use flashattn::{Config, DeviceBuffer, RawForwardArgs, RawTensor, Runtime, Status};

const P: Problem = Problem {
    batch: 5,
    seqlen_q: 19,
    seqlen_k: 45,
    hq: 32,
    hkv: 8,
    d: 64,
    dv: 64,
    causal: true,
    scale: 0.125,
};

const VAR: &str = "FLASHATTN_SM90_PERSISTENT";

/// (without the persistent policy, with it), both emulating sm_90.
fn runtimes() -> (Runtime, Runtime) {
    std::env::remove_var(VAR);
    let plain = common::emulator_sm(90);
    std::env::set_var(VAR, "1");
    let persistent = common::emulator_sm(90);
    std::env::remove_var(VAR);
    (plain, persistent)
}

struct Case {
    cfg: Config,
    host: [Vec<u16>; 3],
    want: (Vec<f64>, Vec<f64>),
}

impl Case {
    fn new() -> Case {
        let ([qb, kb, vb], [qf, kf, vf]) = f16_qkv(&P, 8108);
        let cfg = problem_config(&P, flashattn::Dtype::F16);
        let want = reference(&P, &qf, &kf, &vf, &[P.seqlen_k; P.batch]);
        Case { cfg, host: [qb, kb, vb], want }
    }

    fn inputs(&self, rt: &Runtime) -> [DeviceBuffer; 3] {
        self.host.clone().map(|h| rt.alloc_from(&h).unwrap())
    }

    /// O (fp16 bits) and LSE of a forward, or its error; outputs poisoned.
    fn run(
        &self,
        rt: &Runtime,
        x: &[DeviceBuffer; 3],
        ws: Option<&mut DeviceBuffer>,
    ) -> flashattn::Result<(Vec<u16>, Vec<f32>)> {
        let (o, lse, r) = forward_contiguous_ws(rt, &self.cfg, &P, [&x[0], &x[1], &x[2]], 2, ws);
        r.map(|()| (o.to_vec().unwrap(), lse.to_vec().unwrap()))
    }

    /// Against the f64 reference.
    fn check(&self, what: &str, got: &(Vec<u16>, Vec<f32>)) {
        let err = max_abs_err(&flashattn::f16_slice_to_f32(&got.0), &self.want.0);
        assert!(err <= F16_TOL, "{what}: o max abs error {err}");
        check_lse(&got.1, &self.want.1);
    }
}

/// Raw args of the forward on x (host fields: what the size query reads).
fn raw_args(x: &[DeviceBuffer; 3], o: &DeviceBuffer) -> RawForwardArgs {
    let t = |b: &DeviceBuffer, s: usize, h: usize| RawTensor {
        data: b.as_ptr(),
        strides: [(s * h * P.d) as i64, (h * P.d) as i64, P.d as i64, 1],
    };
    RawForwardArgs {
        batch: P.batch as i32,
        seqlen_q: P.seqlen_q as i32,
        seqlen_k: P.seqlen_k as i32,
        q: t(&x[0], P.seqlen_q, P.hq),
        k: t(&x[1], P.seqlen_k, P.hkv),
        v: t(&x[2], P.seqlen_k, P.hkv),
        o: t(o, P.seqlen_q, P.hq),
        ..Default::default()
    }
}

fn counters(ws: &DeviceBuffer) -> Vec<u32> {
    let mut w = [7u32; 2];
    ws.download(&mut w).unwrap();
    w.to_vec()
}

#[test]
fn dynamic_scheduling_through_the_workspace() {
    let (plain, persistent) = runtimes();
    let c = Case::new();
    let (xp, xd) = (c.inputs(&plain), c.inputs(&persistent));

    // The size query: 8 with the policy, 0 without.
    let o_bytes = 2 * P.batch * P.seqlen_q * P.hq * P.dv;
    let od = persistent.alloc(o_bytes).unwrap();
    assert_eq!(persistent.forward_workspace_size(&c.cfg, &raw_args(&xd, &od)).unwrap(), 8);
    let op = plain.alloc(o_bytes).unwrap();
    let raw = raw_args(&xp, &op);
    assert_eq!(plain.forward_workspace_size(&c.cfg, &raw).unwrap(), 0);
    let bad = RawForwardArgs { seqlen_q: 0, ..raw };
    let e = plain.forward_workspace_size(&c.cfg, &bad).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");

    // One CTA per item (no policy), then the persistent kernel: the static
    // order (no workspace) and the dynamic one, twice on one workspace that
    // the kernel leaves zero; all bit-identical.
    let want = c.run(&plain, &xp, None).unwrap();
    c.check("one CTA per item", &want);
    let got = c.run(&persistent, &xd, None).unwrap();
    assert!(got == want, "static persistent order differs from one CTA per item");
    let mut ws = persistent.alloc(8).unwrap();
    ws.fill_bytes(0).unwrap();
    for run in 0..2 {
        let got = c.run(&persistent, &xd, Some(&mut ws)).unwrap();
        c.check(&format!("dynamic, run {run}"), &got);
        assert!(got == want, "dynamic run {run}: O/LSE not bit-identical to one CTA per item");
        assert_eq!(counters(&ws), [0, 0], "dynamic run {run}: workspace not left zero");
    }
    // Another kernel ignores a workspace.
    let mut ws_plain = plain.alloc(8).unwrap();
    ws_plain.fill_bytes(0).unwrap();
    assert!(c.run(&plain, &xp, Some(&mut ws_plain)).unwrap() == want);

    // A workspace that is not zero: the kernel reads it and skips items.
    ws.upload(&[5u32, 0]).unwrap();
    let got = c.run(&persistent, &xd, Some(&mut ws)).unwrap();
    let nan = flashattn::f16_slice_to_f32(&got.0).iter().any(|x| x.is_nan());
    assert!(nan && got != want, "a workspace at {{5, 0}} changed nothing: was it passed?");

    // Too small: the library's error names it.
    let mut small = persistent.alloc(4).unwrap();
    let e = c.run(&persistent, &xd, Some(&mut small)).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("workspace_size is 4"), "{e}");
    // Another runtime's memory is refused before the library sees it.
    let e = c.run(&persistent, &xd, Some(&mut ws_plain)).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("workspace is memory of another runtime"), "{e}");
}
