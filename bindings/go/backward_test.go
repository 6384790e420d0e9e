package flashattn

// The training backward (Runtime.Backward, C API 0.9) on the emulator: dQ,
// dK and dV of a forward with GQA and causal masking (seqlen_q != seqlen_k)
// and of one with attention sinks, element by element against a float64
// host computation (FlashAttention-2's Algorithm 2 over the forward's own
// O); deterministic runs give the same bits; the library's checks.

import (
	"math"
	"math/rand"
	"strings"
	"testing"
)

// hostBackward returns float64 dq, dk, dv and dsinks of O = softmax(scale q
// k^T (+ the causal mask, bottom-right) (+ sinks in the denominator)) v for
// the upstream gradient dout, D_i from the forward's o.
func hostBackward(p problem, q, k, v, o, dout, sinks []float32) (dq, dk, dv, ds []float64) {
	scale := 1 / math.Sqrt(float64(p.d))
	g := p.hq / p.hkv
	iq := func(b, i, h int) int { return ((b*p.sq+i)*p.hq + h) * p.d }
	ik := func(b, j, h int) int { return ((b*p.skMax+j)*p.hkv + h) * p.d }
	dq, dk, dv = make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	ds = make([]float64, p.hq)
	for b := 0; b < p.batch; b++ {
		for h := 0; h < p.hq; h++ {
			hk := h / g
			for i := 0; i < p.sq; i++ {
				var seen []int
				var x []float64
				m := math.Inf(-1)
				for j := 0; j < p.skMax; j++ {
					if p.causal && j+p.sq > i+p.skMax {
						continue
					}
					s := 0.0
					for c := 0; c < p.d; c++ {
						s += float64(q[iq(b, i, h)+c]) * float64(k[ik(b, j, hk)+c])
					}
					seen, x = append(seen, j), append(x, s*scale)
					m = math.Max(m, s*scale)
				}
				if sinks != nil {
					m = math.Max(m, float64(sinks[h]))
				}
				den := 0.0
				for _, t := range x {
					den += math.Exp(t - m)
				}
				if sinks != nil {
					den += math.Exp(float64(sinks[h]) - m)
				}
				rowD := 0.0
				for c := 0; c < p.d; c++ {
					rowD += float64(dout[iq(b, i, h)+c]) * float64(o[iq(b, i, h)+c])
				}
				if sinks != nil {
					ds[h] -= math.Exp(float64(sinks[h])-m) / den * rowD
				}
				for n, j := range seen {
					pr := math.Exp(x[n]-m) / den
					dp := 0.0
					for c := 0; c < p.d; c++ {
						gout := float64(dout[iq(b, i, h)+c])
						dp += gout * float64(v[ik(b, j, hk)+c])
						dv[ik(b, j, hk)+c] += pr * gout
					}
					dz := pr * (dp - rowD) * scale
					for c := 0; c < p.d; c++ {
						dq[iq(b, i, h)+c] += dz * float64(k[ik(b, j, hk)+c])
						dk[ik(b, j, hk)+c] += dz * float64(q[iq(b, i, h)+c])
					}
				}
			}
		}
	}
	return dq, dk, dv, ds
}

// checkGrad: every element finite and max |got - want| <= tol * max |want|.
func checkGrad(t *testing.T, what string, got []float64, want []float64, tol float64) {
	t.Helper()
	big, worst := 0.0, 0.0
	for i := range want {
		if math.IsNaN(got[i]) || math.IsInf(got[i], 0) {
			t.Fatalf("%s[%d] = %v", what, i, got[i])
		}
		big = math.Max(big, math.Abs(want[i]))
		worst = math.Max(worst, math.Abs(got[i]-want[i]))
	}
	if big == 0 || worst > tol*big {
		t.Fatalf("%s: max abs err %g, max |ref| %g", what, worst, big)
	}
}

// bwdSetup is a forward that ran (fp16), ready for its backward.
type bwdSetup struct {
	p                  problem
	cfg                *Config
	fwd                ForwardArgs
	qf, kf, vf, gf, of []float32
	dout               *DeviceMemory
}

func newBackward(t *testing.T, rt *Runtime, p problem, seed int64, sinks []float32) *bwdSetup {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	qh, qf := randHalf(r, p.batch*p.sq*p.hq*p.d, 1)
	kh, kf := randHalf(r, p.batch*p.skMax*p.hkv*p.d, 1)
	vh, vf := randHalf(r, p.batch*p.skMax*p.hkv*p.dv, 1)
	gh, gf := randHalf(r, p.batch*p.sq*p.hq*p.dv, 1)
	cfg := newCfg(t, ConfigDesc{HeadDim: int32(p.d), NumHeadsQ: int32(p.hq),
		NumHeadsKV: int32(p.hkv), Causal: p.causal})
	q, k, v := upload(t, rt, qh), upload(t, rt, kh), upload(t, rt, vh)
	o := poisoned(t, rt, uint64(len(gh))*2)
	lse := poisoned(t, rt, uint64(p.batch*p.hq*p.sq)*4)
	a := denseForwardArgs(p, q, k, v, o, lse)
	if sinks != nil {
		a.Sinks = upload(t, rt, sinks).Ptr()
	}
	if err := rt.Forward(cfg, &a); err != nil {
		t.Fatalf("Forward: %v", err)
	}
	oh := make([]uint16, len(gh))
	if err := o.DownloadUint16(oh); err != nil {
		t.Fatal(err)
	}
	return &bwdSetup{p: p, cfg: cfg, fwd: a, qf: qf, kf: kf, vf: vf, gf: gf,
		of: FromFP16(oh), dout: upload(t, rt, gh)}
}

// run runs Backward into NaN-filled buffers and returns dq, dk, dv as
// float64 (dsinks written to ds when the forward had sinks).
func (s *bwdSetup) run(t *testing.T, rt *Runtime, deterministic bool, ds *DeviceMemory,
	ws *DeviceMemory) ([3][]float64, error) {
	t.Helper()
	p := s.p
	nq, nk := p.batch*p.sq*p.hq*p.d, p.batch*p.skMax*p.hkv*p.d
	dq, dk, dv := poisoned(t, rt, uint64(nq)*2), poisoned(t, rt, uint64(nk)*2),
		poisoned(t, rt, uint64(nk)*2)
	a := BackwardArgs{
		Fwd:           s.fwd,
		DOut:          Contiguous(s.dout.Ptr(), int64(p.sq), int64(p.hq), int64(p.dv)),
		DQ:            Contiguous(dq.Ptr(), int64(p.sq), int64(p.hq), int64(p.d)),
		DK:            Contiguous(dk.Ptr(), int64(p.skMax), int64(p.hkv), int64(p.d)),
		DV:            Contiguous(dv.Ptr(), int64(p.skMax), int64(p.hkv), int64(p.dv)),
		Deterministic: deterministic,
	}
	if ds != nil {
		a.DSinks = ds.Ptr()
	}
	if ws == nil {
		n, err := rt.BackwardWorkspaceSize(s.cfg, &a)
		if err != nil {
			return [3][]float64{}, err
		}
		if n == 0 {
			t.Fatalf("BackwardWorkspaceSize: 0 bytes (it holds dQ's fp32 accumulators)")
		}
		ws = poisoned(t, rt, n)
	}
	a.Workspace, a.WorkspaceSize = ws.Ptr(), ws.Size()
	if err := rt.Backward(s.cfg, &a); err != nil {
		return [3][]float64{}, err
	}
	var out [3][]float64
	for i, m := range []*DeviceMemory{dq, dk, dv} {
		h := make([]uint16, m.Size()/2)
		if err := m.DownloadUint16(h); err != nil {
			t.Fatal(err)
		}
		out[i] = decodeBits(FP16, h)
	}
	return out, nil
}

// skipWithoutBackward skips a test when the loaded library predates fa_backward.
func skipWithoutBackward(t *testing.T, rt *Runtime) {
	t.Helper()
	_, err := rt.BackwardWorkspaceSize(nil, &BackwardArgs{})
	if err != nil && strings.Contains(err.Error(), "has no fa_backward") {
		t.Skip(err.Error())
	}
}

func TestBackwardGQACausal(t *testing.T) {
	rt := newRT(t)
	skipWithoutBackward(t, rt)
	p := problem{batch: 2, sq: 24, skMax: 40, hq: 4, hkv: 2, d: 32, dv: 32, causal: true}
	s := newBackward(t, rt, p, 7, nil)
	got, err := s.run(t, rt, false, nil, nil)
	if err != nil {
		t.Fatalf("Backward: %v", err)
	}
	dq, dk, dv, _ := hostBackward(p, s.qf, s.kf, s.vf, s.of, s.gf, nil)
	for i, want := range [][]float64{dq, dk, dv} {
		checkGrad(t, []string{"dq", "dk", "dv"}[i], got[i], want, 1e-2)
	}
}

func TestBackwardSinksDeterministic(t *testing.T) {
	rt := newRT(t)
	skipWithoutBackward(t, rt)
	p := problem{batch: 1, sq: 32, skMax: 32, hq: 2, hkv: 2, d: 64, dv: 64, causal: true}
	sinks := []float32{0.25, 1.5}
	s := newBackward(t, rt, p, 11, sinks)
	ds := poisoned(t, rt, 8)
	a, err := s.run(t, rt, true, ds, nil)
	if err != nil {
		t.Fatalf("Backward: %v", err)
	}
	dq, dk, dv, dsw := hostBackward(p, s.qf, s.kf, s.vf, s.of, s.gf, sinks)
	for i, want := range [][]float64{dq, dk, dv} {
		checkGrad(t, []string{"dq", "dk", "dv"}[i], a[i], want, 1e-2)
	}
	got := make([]float32, 2)
	if err := ds.DownloadFloat32(got); err != nil {
		t.Fatal(err)
	}
	checkGrad(t, "dsinks", []float64{float64(got[0]), float64(got[1])}, dsw, 1e-2)
	b, err := s.run(t, rt, true, ds, nil)
	if err != nil {
		t.Fatalf("Backward: %v", err)
	}
	for i := range a {
		for j := range a[i] {
			if math.Float64bits(a[i][j]) != math.Float64bits(b[i][j]) {
				t.Fatalf("deterministic: gradient %d element %d: %v then %v", i, j, a[i][j], b[i][j])
			}
		}
	}
}

func TestBackwardErrors(t *testing.T) {
	rt := newRT(t)
	skipWithoutBackward(t, rt)
	p := problem{batch: 1, sq: 16, skMax: 16, hq: 2, hkv: 1, d: 32, dv: 32}
	s := newBackward(t, rt, p, 13, nil)
	tiny := poisoned(t, rt, 256)
	_, err := s.run(t, rt, false, nil, tiny)
	wantErr(t, err, StatusInvalidArgument, "workspace")
	// Sinks' gradient without sinks.
	ds := poisoned(t, rt, 8)
	_, err = s.run(t, rt, false, ds, nil)
	wantErr(t, err, StatusInvalidArgument, "dsinks")
	if err := rt.Backward(s.cfg, nil); err == nil {
		t.Fatal("Backward(nil) succeeded")
	}
}
