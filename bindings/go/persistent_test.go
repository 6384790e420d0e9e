package flashattn

import (
	"math"
	"math/rand"
	"testing"
)

// The persistent sm_90a forward's dynamic scheduling (C API 0.8:
// ForwardArgs.Workspace, Runtime.ForwardWorkspaceSize) on an emulated
// sm_90. The kernel policy (FLASHATTN_SM90_PERSISTENT) is read when a
// runtime is created, so the test creates one with the variable at 0 and
// one with it at 1 (t.Setenv: no test of this package runs in parallel).
// The problem has 160 work items (5 batches x 32 query heads x one m-block)
// on the emulator's 108 SMs: CTAs take their second item from the
// workspace's counter, so a workspace that is not zero skips items.
func TestPersistentForwardWorkspace(t *testing.T) {
	const policy = "FLASHATTN_SM90_PERSISTENT"
	t.Setenv(policy, "0")
	plain := newRTsm(t, 90)
	t.Setenv(policy, "1")
	dyn := newRTsm(t, 90)
	t.Setenv(policy, "0")

	p := problem{batch: 5, sq: 19, skMax: 45, hq: 32, hkv: 8, d: 64, dv: 64, causal: true}
	p.scale = 1 / math.Sqrt(float64(p.d))
	p.kvLen = []int{45, 45, 45, 45, 45}
	r := rand.New(rand.NewSource(8108))
	qh, qf := randHalf(r, p.batch*p.sq*p.hq*p.d, 1)
	kh, kf := randHalf(r, p.batch*p.skMax*p.hkv*p.d, 1)
	vh, vf := randHalf(r, p.batch*p.skMax*p.hkv*p.dv, 1)
	want, wantLSE := reference(p, qf, kf, vf)
	cfg := newCfg(t, ConfigDesc{HeadDim: 64, NumHeadsQ: 32, NumHeadsKV: 8, Causal: true})

	// args: Forward's arguments on rt (inputs uploaded, outputs poisoned).
	args := func(rt *Runtime) (ForwardArgs, *DeviceMemory, *DeviceMemory) {
		o := poisoned(t, rt, uint64(len(want))*2)
		lse := poisoned(t, rt, uint64(len(wantLSE))*4)
		return denseForwardArgs(p, upload(t, rt, qh), upload(t, rt, kh), upload(t, rt, vh), o, lse), o, lse
	}
	// run: O bits and LSE of a forward with workspace ws (nil = none).
	run := func(rt *Runtime, ws *DeviceMemory, wsSize uint64) ([]uint16, []float32, error) {
		a, o, lse := args(rt)
		if ws != nil {
			a.Workspace, a.WorkspaceSize = ws.Ptr(), wsSize
		}
		err := rt.Forward(cfg, &a)
		got, gotLSE := make([]uint16, len(want)), make([]float32, len(wantLSE))
		if e := o.DownloadUint16(got); e != nil {
			t.Fatal(e)
		}
		if e := lse.DownloadFloat32(gotLSE); e != nil {
			t.Fatal(e)
		}
		return got, gotLSE, err
	}
	same := func(o1 []uint16, l1 []float32, o2 []uint16, l2 []float32) bool {
		for i := range o1 {
			if o1[i] != o2[i] {
				return false
			}
		}
		for i := range l1 {
			if math.Float32bits(l1[i]) != math.Float32bits(l2[i]) {
				return false
			}
		}
		return true
	}
	counters := func(ws *DeviceMemory) [2]int32 {
		w := []int32{7, 7}
		if err := ws.DownloadInt32(w); err != nil {
			t.Fatal(err)
		}
		return [2]int32{w[0], w[1]}
	}

	// The size query: 8 with the policy, 0 without.
	for _, c := range []struct {
		rt   *Runtime
		want uint64
	}{{dyn, 8}, {plain, 0}} {
		a, _, _ := args(c.rt)
		if n, err := c.rt.ForwardWorkspaceSize(cfg, &a); n != c.want || err != nil {
			t.Fatalf("ForwardWorkspaceSize = %d, %v; want %d", n, err, c.want)
		}
	}
	a, _, _ := args(plain)
	a.SeqlenQ = 0
	_, err := plain.ForwardWorkspaceSize(cfg, &a)
	wantErr(t, err, StatusInvalidArgument, "seqlen_q")
	_, err = plain.ForwardWorkspaceSize(cfg, nil)
	wantErr(t, err, StatusInvalidArgument, "ForwardWorkspaceSize: args is nil")

	// One CTA per item (no policy), then the persistent kernel: the static
	// order (no workspace) and the dynamic one, twice on one workspace that
	// the kernel leaves zero; all bit-identical.
	refO, refLSE, err := run(plain, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	compareO(t, "one CTA per item O", refO, want, 3e-3)
	compareLSE(t, "one CTA per item LSE", refLSE, wantLSE)
	if o, l, err := run(dyn, nil, 0); err != nil || !same(o, l, refO, refLSE) {
		t.Fatalf("static persistent order: %v, or O/LSE differ from one CTA per item", err)
	}
	ws, err := dyn.Malloc(8)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Free()
	if err := ws.Memset(0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		o, l, err := run(dyn, ws, 8)
		if err != nil {
			t.Fatalf("dynamic run %d: %v", i, err)
		}
		compareO(t, "dynamic O", o, want, 3e-3)
		compareLSE(t, "dynamic LSE", l, wantLSE)
		if !same(o, l, refO, refLSE) {
			t.Fatalf("dynamic run %d: O/LSE not bit-identical to one CTA per item", i)
		}
		if c := counters(ws); c != [2]int32{0, 0} {
			t.Fatalf("dynamic run %d: workspace left at %v, not zero", i, c)
		}
	}

	// A workspace that is not zero: the kernel reads it and skips items.
	if err := ws.UploadInt32([]int32{5, 0}); err != nil {
		t.Fatal(err)
	}
	o, l, err := run(dyn, ws, 8)
	if err != nil || same(o, l, refO, refLSE) {
		t.Fatalf("a workspace at {5, 0}: %v, and O/LSE unchanged (was it passed?)", err)
	}

	// Too small or misaligned: refused naming it, nothing written.
	for _, c := range []struct {
		ptr  uint64
		size uint64
		sub  string
	}{{ws.Ptr(), 4, "workspace_size is 4"}, {ws.Ptr() + 4, 8, "not 8-byte aligned"}} {
		a, o, _ := args(dyn)
		a.Workspace, a.WorkspaceSize = c.ptr, c.size
		wantErr(t, dyn.Forward(cfg, &a), StatusInvalidArgument, c.sub)
		got := make([]uint16, len(want))
		if err := o.DownloadUint16(got); err != nil {
			t.Fatal(err)
		}
		for i, x := range got {
			if x != 0xffff {
				t.Fatalf("refused workspace (%s): O[%d] written", c.sub, i)
			}
		}
	}
}
