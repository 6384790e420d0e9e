package flashattn

// KV append with rotary embedding (DecodeArgs.KNew/VNew/Rotary*, C API 0.5;
// as FlashAttention's flash_attn_with_kvcache) on the emulator: a contiguous
// GQA cache, 2 new tokens per sequence, GPT-NeoX rotary with fp32 tables
// (and GPT-J with explicit positions), against the float64 reference with Q
// and the new keys rotated in float64; the cache is then downloaded: new V
// rows equal VNew bit for bit, new K rows within 1e-2 of the float64
// rotation, every other row unchanged. Bad append arguments are
// StatusInvalidArgument.

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

const (
	apB, apSN, apHQ, apHKV, apD, apSK, apRD = 2, 2, 4, 2, 64, 48, 32
)

// ropeTables: fp32 cos/sin [rows, rd/2] (theta 10000).
func ropeTables(rows, rd int) ([]float32, []float32) {
	var c, s []float32
	for p := 0; p < rows; p++ {
		for i := 0; i < rd/2; i++ {
			a := float64(p) * math.Pow(10000, -float64(2*i)/float64(rd))
			c = append(c, float32(math.Cos(a)))
			s = append(s, float32(math.Sin(a)))
		}
	}
	return c, s
}

func TestDecodeAppendRotary(t *testing.T) {
	rt := newRT(t)
	cfg := newCfg(t, ConfigDesc{HeadDim: apD, NumHeadsQ: apHQ, NumHeadsKV: apHKV, Causal: true})
	lens := []int{30, 5} // before the append
	for ci, c := range []struct{ interleaved, positions bool }{{false, false}, {true, true}} {
		c := c
		t.Run(fmt.Sprintf("interleaved=%v,positions=%v", c.interleaved, c.positions), func(t *testing.T) {
			r := rand.New(rand.NewSource(int64(90 + ci)))
			qh, qf := randHalf(r, apB*apSN*apHQ*apD, 1)
			kh, kf := randHalf(r, apB*apSK*apHKV*apD, 1)
			vh, vf := randHalf(r, apB*apSK*apHKV*apD, 1)
			knh, knf := randHalf(r, apB*apSN*apHKV*apD, 1)
			vnh, vnf := randHalf(r, apB*apSN*apHKV*apD, 1)
			cos, sin := ropeTables(apSK, apRD)

			// Expected cache (float64 rotation of KNew, VNew as is), rotated Q.
			wantK := make([]float64, len(kf))
			for i, x := range kf {
				wantK[i] = float64(x)
			}
			k32 := append([]float32(nil), kf...)
			v32 := append([]float32(nil), vf...)
			qRot := make([]float32, len(qf))
			for b := 0; b < apB; b++ {
				for tk := 0; tk < apSN; tk++ {
					pos := lens[b] + tk
					for h := 0; h < apHKV; h++ {
						src := ((b*apSN+tk)*apHKV + h) * apD
						dst := ((b*apSK+pos)*apHKV + h) * apD
						rk := rope64(knf[src:src+apD], pos, cos, sin, apRD, c.interleaved)
						for i := 0; i < apD; i++ {
							wantK[dst+i] = rk[i]
							k32[dst+i] = float32(rk[i])
							v32[dst+i] = vnf[src+i]
						}
					}
					for h := 0; h < apHQ; h++ {
						i0 := ((b*apSN+tk)*apHQ + h) * apD
						rq := rope64(qf[i0:i0+apD], pos, cos, sin, apRD, c.interleaved)
						for i := 0; i < apD; i++ {
							qRot[i0+i] = float32(rq[i])
						}
					}
				}
			}
			p := problem{batch: apB, sq: apSN, skMax: apSK, hq: apHQ, hkv: apHKV, d: apD, dv: apD,
				causal: true, scale: 1 / math.Sqrt(apD), kvLen: []int{lens[0] + apSN, lens[1] + apSN}}
			want, wantLSE := reference(p, qRot, k32, v32)

			q, kc, vc := upload(t, rt, qh), upload(t, rt, kh), upload(t, rt, vh)
			kn, vn := upload(t, rt, knh), upload(t, rt, vnh)
			cd, sd := upload(t, rt, cos), upload(t, rt, sin)
			cl := upload(t, rt, []int32{int32(lens[0]), int32(lens[1])})
			// Explicit positions equal to the default ones (row stride 3 > SN).
			pd := upload(t, rt, []int32{int32(lens[0]), int32(lens[0] + 1), -7,
				int32(lens[1]), int32(lens[1] + 1), -7})
			o := poisoned(t, rt, uint64(len(want))*2)
			lse := poisoned(t, rt, uint64(len(wantLSE))*4)
			a := DecodeArgs{Batch: apB, SeqlenQ: apSN, SeqlenKMax: apSK,
				Q:            Contiguous(q.Ptr(), apSN, apHQ, apD),
				KCache:       Contiguous(kc.Ptr(), apSK, apHKV, apD),
				VCache:       Contiguous(vc.Ptr(), apSK, apHKV, apD),
				CacheSeqlens: cl.Ptr(), NumSplits: 2,
				O:    Contiguous(o.Ptr(), apSN, apHQ, apD),
				LSE:  lse.Ptr(),
				KNew: Contiguous(kn.Ptr(), apSN, apHKV, apD),
				VNew: Contiguous(vn.Ptr(), apSN, apHKV, apD), SeqlenNew: apSN,
				RotaryDim: apRD, RotaryCos: cd.Ptr(), RotarySin: sd.Ptr(), SeqlenRo: apSK,
				RotaryInterleaved: c.interleaved, RotaryDType: FP32}
			if c.positions {
				a.RotaryPositions, a.RotaryPositionsStride = pd.Ptr(), 3
			}
			if err := rt.Decode(cfg, &a); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			got := make([]uint16, len(want))
			gotLSE := make([]float32, len(wantLSE))
			if err := o.DownloadUint16(got); err != nil {
				t.Fatal(err)
			}
			if err := lse.DownloadFloat32(gotLSE); err != nil {
				t.Fatal(err)
			}
			compareO(t, "append O", got, want, 3e-3)
			compareLSE(t, "append LSE", gotLSE, wantLSE)

			// The cache was written in place: only rows lens[b] .. lens[b] + SN.
			gk := make([]uint16, len(kh))
			gv := make([]uint16, len(vh))
			if err := kc.DownloadUint16(gk); err != nil {
				t.Fatal(err)
			}
			if err := vc.DownloadUint16(gv); err != nil {
				t.Fatal(err)
			}
			for b := 0; b < apB; b++ {
				for j := 0; j < apSK; j++ {
					for h := 0; h < apHKV; h++ {
						at := ((b*apSK+j)*apHKV + h) * apD
						isNew := j >= lens[b] && j < lens[b]+apSN
						src := ((b*apSN+(j-lens[b]))*apHKV + h) * apD
						for i := 0; i < apD; i++ {
							if !isNew {
								if gk[at+i] != kh[at+i] || gv[at+i] != vh[at+i] {
									t.Fatalf("cache row [%d][%d][%d] changed", b, j, h)
								}
								continue
							}
							if gv[at+i] != vnh[src+i] {
								t.Fatalf("v[%d][%d][%d][%d] = %#x, want %#x", b, j, h, i, gv[at+i], vnh[src+i])
							}
							g := float64(FP16ToFloat32(gk[at+i]))
							if d := math.Abs(g - wantK[at+i]); !(d <= 1e-2) {
								t.Fatalf("k[%d][%d][%d][%d] = %v, want %v", b, j, h, i, g, wantK[at+i])
							}
						}
					}
				}
			}
		})
	}
}

func TestDecodeAppendBad(t *testing.T) {
	rt := newRT(t)
	cfg := newCfg(t, ConfigDesc{HeadDim: apD, NumHeadsQ: apHQ, NumHeadsKV: apHKV})
	q := poisoned(t, rt, apHQ*apD*2)
	kc, vc := poisoned(t, rt, 8*apHKV*apD*2), poisoned(t, rt, 8*apHKV*apD*2)
	kn := poisoned(t, rt, apHKV*apD*2)
	o := poisoned(t, rt, apHQ*apD*2)
	cl := upload(t, rt, []int32{3})
	cos, sin := ropeTables(8, apRD)
	cd, sd := upload(t, rt, cos), upload(t, rt, sin)
	good := DecodeArgs{Batch: 1, SeqlenQ: 1, SeqlenKMax: 8,
		Q:            Contiguous(q.Ptr(), 1, apHQ, apD),
		KCache:       Contiguous(kc.Ptr(), 8, apHKV, apD),
		VCache:       Contiguous(vc.Ptr(), 8, apHKV, apD),
		CacheSeqlens: cl.Ptr(), O: Contiguous(o.Ptr(), 1, apHQ, apD),
		KNew: Contiguous(kn.Ptr(), 1, apHKV, apD), VNew: Contiguous(kn.Ptr(), 1, apHKV, apD),
		SeqlenNew: 1, RotaryDim: apRD, RotaryCos: cd.Ptr(), RotarySin: sd.Ptr(), SeqlenRo: 8}
	a := good
	a.VNew = Tensor{}
	wantErr(t, rt.Decode(cfg, &a), StatusInvalidArgument, "")
	a = good
	a.SeqlenNew = 9
	wantErr(t, rt.Decode(cfg, &a), StatusInvalidArgument, "")
	a = good
	a.RotaryDim = 24 // not a multiple of 16
	wantErr(t, rt.Decode(cfg, &a), StatusInvalidArgument, "rotary_dim")
	a = good
	a.KNew = Tensor{} // rotary without an append
	wantErr(t, rt.Decode(cfg, &a), StatusInvalidArgument, "")
	if err := rt.Decode(cfg, &good); err != nil {
		t.Fatalf("Decode: %v", err)
	}
}
