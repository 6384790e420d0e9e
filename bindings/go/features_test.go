package flashattn

// The feature descriptions (tests/features/*.cases; the line format in the
// README there): TestFeatures runs every line of every file through this
// binding on the emulator (sm_89 for lines with kv_dtype, else sm_80), one
// subtest per file and per line ("TestFeatures/alibi/alibi.cases:3"). Inputs
// come from the line's seed (this file's generator), outputs are poisoned
// (NaN) first and compared with the float64 reference of flashattn_test.go;
// a decode also checks its KV storage afterwards (appended rows as the
// library documents them, every other byte unchanged). A reject line builds
// the same call, makes the argument `bad=` names bad and wants the status and
// message. An unknown op, key, value or bad= fails its line.

import (
	"bufio"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// featuresDir holds the descriptions, relative to this package (go test runs
// in bindings/go).
const featuresDir = "../../tests/features"

func TestFeatures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(featuresDir, "*.cases"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no .cases files in %s (%v)", featuresDir, err)
	}
	rts := map[int]*Runtime{80: newRTsm(t, 80), 89: newRTsm(t, 89)}
	for _, f := range files {
		f := f
		t.Run(strings.TrimSuffix(filepath.Base(f), ".cases"), func(t *testing.T) {
			runFeatureFile(t, rts, f)
		})
	}
}

// newRTsm creates an emulator runtime of SM sm with an in-memory cache.
func newRTsm(t *testing.T, sm int) *Runtime {
	t.Helper()
	rt, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, EmulatorSM: int32(sm), CacheMode: CacheMemory})
	if err != nil {
		t.Fatalf("NewRuntime(sm %d): %v", sm, err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func runFeatureFile(t *testing.T, rts map[int]*Runtime, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	lines := 0
	for n := 1; sc.Scan(); n++ {
		where := fmt.Sprintf("%s:%d", filepath.Base(path), n)
		c, err := parseFeatureLine(where, sc.Text())
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if c == nil {
			continue
		}
		lines++
		t.Run(where, func(t *testing.T) {
			sm := 80
			if _, ok := c.keys["kv_dtype"]; ok {
				sm = 89
			}
			runFeatureCase(t, rts[sm], c, nil)
		})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if lines == 0 {
		t.Fatalf("%s: no lines", path)
	}
}

// featureCase is one parsed line: op and key=value pairs. Every key must be
// read by the driver (c.use), else the line fails as unknown.
type featureCase struct {
	where, text, op string
	keys            map[string]string
	used            map[string]bool
	errs            []string
}

// parseFeatureLine parses one line; nil for a blank or comment-only line.
func parseFeatureLine(where, text string) (*featureCase, error) {
	if i := strings.IndexByte(text, '#'); i >= 0 {
		text = text[:i]
	}
	fields := strings.Fields(text)
	if len(fields) == 0 {
		return nil, nil
	}
	c := &featureCase{where: where, text: strings.TrimSpace(text), op: fields[0],
		keys: map[string]string{}, used: map[string]bool{}}
	switch c.op {
	case "forward", "decode", "reduce", "reject":
	default:
		return nil, fmt.Errorf("%s: unknown op %q", where, c.op)
	}
	for _, kv := range fields[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%s: %q is not key=value", where, kv)
		}
		if _, dup := c.keys[k]; dup {
			return nil, fmt.Errorf("%s: key %s given twice", where, k)
		}
		c.keys[k] = v
	}
	return c, nil
}

func (c *featureCase) fail(format string, args ...interface{}) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// use marks key read and returns its value ("" when absent).
func (c *featureCase) use(key string) (string, bool) {
	c.used[key] = true
	v, ok := c.keys[key]
	return v, ok
}

// num is an integer key (def when absent; def < -1000 = required).
func (c *featureCase) num(key string, def int) int {
	v, ok := c.use(key)
	if !ok {
		if def < -1000 {
			c.fail("missing key %s", key)
			return 1
		}
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		c.fail("%s=%s is not an integer", key, v)
	}
	return n
}

const required = -1 << 20

func (c *featureCase) float(key string) float64 {
	v, ok := c.use(key)
	if !ok {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		c.fail("%s=%s is not a number", key, v)
	}
	return f
}

// enum is a key with values from allowed (def when absent; "" = none).
func (c *featureCase) enum(key, def string, allowed ...string) string {
	v, ok := c.use(key)
	if !ok {
		return def
	}
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	c.fail("%s=%s: unknown value (known: %s)", key, v, strings.Join(allowed, ", "))
	return def
}

// list is a comma-separated list of n integers (def each when absent).
func (c *featureCase) list(key string, n, def int) []int {
	out := make([]int, n)
	v, ok := c.use(key)
	if !ok {
		for i := range out {
			out[i] = def
		}
		return out
	}
	parts := strings.Split(v, ",")
	if len(parts) != n {
		c.fail("%s=%s: want %d values", key, v, n)
		return c.list("", n, def)
	}
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil {
			c.fail("%s=%s: %q is not an integer", key, v, p)
		}
		out[i] = x
	}
	return out
}

// done fails the test on a parse error or a key nothing read.
func (c *featureCase) done(t *testing.T) {
	t.Helper()
	var unknown []string
	for k := range c.keys {
		if !c.used[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		c.fail("unknown key %s for %s", k, c.op)
	}
	if len(c.errs) > 0 {
		t.Fatalf("%s: %s", c.where, strings.Join(c.errs, "; "))
	}
}

var featureStatus = map[string]Status{
	"INVALID_ARGUMENT": StatusInvalidArgument, "UNSUPPORTED": StatusUnsupported,
	"OUT_OF_MEMORY": StatusOutOfMemory, "NO_DRIVER": StatusNoDriver, "NO_DEVICE": StatusNoDevice,
	"CUDA": StatusCUDA, "COMPILE": StatusCompile, "LAUNCH": StatusLaunch,
	"RUNTIME_POISONED": StatusRuntimePoisoned, "BUFFER_TOO_SMALL": StatusBufferTooSmall,
	"INTERNAL": StatusInternal, "CACHE": StatusCache,
}

// runFeatureCase runs c on rt: an op line is checked against the reference,
// a reject line must fail as it says. edit (may be nil) changes the built
// call first (the per-feature tests' extra cases).
func runFeatureCase(t *testing.T, rt *Runtime, c *featureCase, edit func(*featureCall)) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s: %s", c.where, c.text)
		}
	})
	if c.op != "reject" {
		fc := buildFeatureCall(t, rt, c, c.op)
		c.done(t)
		if edit != nil {
			edit(fc)
		}
		if err := fc.run(); err != nil {
			t.Fatalf("%s: %s: %v", c.where, c.op, err)
		}
		fc.check(t)
		return
	}
	of := c.enum("of", "", "forward", "decode", "reduce")
	if of == "" {
		c.fail("reject needs of=forward|decode|reduce")
		c.done(t)
	}
	bad, _ := c.use("bad")
	names := make([]string, 0, len(featureStatus))
	for n := range featureStatus {
		names = append(names, n)
	}
	sort.Strings(names)
	status := featureStatus[c.enum("status", "INVALID_ARGUMENT", names...)]
	msg, ok := c.use("message")
	if !ok {
		c.fail("reject needs message=")
	}
	fc := buildFeatureCall(t, rt, c, of)
	mutate, known := featureBad[bad]
	if !known {
		c.fail("bad=%s: unknown argument to make bad", bad)
	} else if !mutate.has(fc) {
		c.fail("bad=%s needs %s", bad, mutate.needs)
	}
	c.done(t)
	if err := mutate.apply(fc); err != nil {
		t.Fatalf("%s: bad=%s: %v", c.where, bad, err)
	}
	if edit != nil {
		edit(fc)
	}
	wantErr(t, fc.run(), status, msg)
	fc.out.untouched(t)
}

// featureLine runs text (one line in the .cases format) on rt, edited first.
func featureLine(t *testing.T, rt *Runtime, text string, edit func(*featureCall)) {
	t.Helper()
	c, err := parseFeatureLine(t.Name(), text)
	if err != nil || c == nil {
		t.Fatalf("%q: %v", text, err)
	}
	runFeatureCase(t, rt, c, edit)
}

// featureReject builds the call of an op line, applies edit and wants status
// with a message containing sub (checks no .cases bad= describes).
func featureReject(t *testing.T, rt *Runtime, text string, edit func(*featureCall), s Status, sub string) {
	t.Helper()
	c, err := parseFeatureLine(t.Name(), text)
	if err != nil || c == nil || c.op == "reject" {
		t.Fatalf("%q: not an op line (%v)", text, err)
	}
	fc := buildFeatureCall(t, rt, c, c.op)
	c.done(t)
	edit(fc)
	wantErr(t, fc.run(), s, sub)
	fc.out.untouched(t)
}

// featureCall is a line's call with its inputs on the device; check compares
// its outputs after a successful run.
type featureCall struct {
	rt    *Runtime
	cfg   *Config
	fwd   *ForwardArgs
	dec   *DecodeArgs
	red   *ReduceArgs
	s     featShape
	out   featOut
	check func(t *testing.T)
}

func (fc *featureCall) run() error {
	switch {
	case fc.fwd != nil:
		return fc.rt.Forward(fc.cfg, fc.fwd)
	case fc.dec != nil:
		return fc.rt.Decode(fc.cfg, fc.dec)
	}
	return fc.rt.DecodeReduce(fc.cfg, fc.red)
}

// featBad makes one argument bad (README, "bad="): apply changes the built
// call, which has what needs names when has says so.
type featBad struct {
	needs string
	has   func(fc *featureCall) bool
	apply func(fc *featureCall) error
}

func hasAlibi(fc *featureCall) bool   { return *fc.fields().alibi != 0 }
func hasSinks(fc *featureCall) bool   { return *fc.fields().sinks != 0 }
func hasDescale(fc *featureCall) bool { return *fc.fields().kDescale != 0 }
func hasRotary(fc *featureCall) bool  { return fc.dec != nil && fc.dec.RotaryDim > 0 }

var featureBad = map[string]featBad{
	"alibi_slopes_misaligned": {"alibi_slopes", hasAlibi, func(fc *featureCall) error {
		*fc.fields().alibi += 2
		return nil
	}},
	"alibi_slopes_stride": {"alibi_slopes", hasAlibi, func(fc *featureCall) error {
		*fc.fields().alibiStride = int64(fc.s.hq - 1)
		return nil
	}},
	"sinks_misaligned": {"sinks", hasSinks, func(fc *featureCall) error {
		*fc.fields().sinks += 2
		return nil
	}},
	"sinks_without_combine": {"a decode with sinks", func(fc *featureCall) bool { return fc.dec != nil && hasSinks(fc) },
		func(fc *featureCall) error { // a workspace for the partial states, no O and LSE
			n, _, err := fc.rt.DecodeWorkspaceSize(fc.cfg, fc.dec)
			if err != nil {
				return err
			}
			ws, err := fc.rt.Malloc(n) // freed by the runtime's Close
			if err != nil {
				return err
			}
			fc.dec.Workspace, fc.dec.WorkspaceSize, fc.dec.O, fc.dec.LSE = ws.Ptr(), n, Tensor{}, 0
			return nil
		}},
	"tree_mask_row_stride": {"a decode with tree_mask", func(fc *featureCall) bool { return fc.dec != nil && fc.dec.TreeMask != 0 },
		func(fc *featureCall) error {
			fc.dec.TreeMaskStride[1] = 4*int64((fc.dec.SeqlenQ+31)/32) - 4
			return nil
		}},
	"lse_format": {"of=reduce", func(fc *featureCall) bool { return fc.red != nil }, func(fc *featureCall) error {
		fc.red.LSEFormat = 7
		return nil
	}},
	"descale_stride": {"descale", hasDescale, func(fc *featureCall) error {
		*fc.fields().descaleStride = [2]int64{-1, 0}
		return nil
	}},
	// The line itself has descales on a 16-bit cache: nothing to change.
	"descale_without_fp8": {"a decode with descale and no kv_dtype",
		func(fc *featureCall) bool { return fc.dec != nil && hasDescale(fc) && fc.s.kvdt == 0 },
		func(*featureCall) error { return nil }},
	"rotary_dim": {"rotary_dim", hasRotary, func(fc *featureCall) error {
		fc.dec.RotaryDim = 8
		return nil
	}},
	"rotary_without_new": {"rotary_dim", hasRotary, func(fc *featureCall) error {
		fc.dec.KNew, fc.dec.VNew, fc.dec.SeqlenNew = Tensor{}, Tensor{}, 0
		return nil
	}},
	"page_size": {"kv_layout=paged", func(fc *featureCall) bool { return fc.fields().kv != nil && fc.fields().kv.Layout == KVPaged },
		func(fc *featureCall) error {
			fc.fields().kv.PageSize = 0
			return nil
		}},
}

// featFields points at the fields of a forward's or decode's arguments the
// mutations change (a reduce has sinks only: dummies, kv nil).
type featFields struct {
	alibi, sinks, kDescale *uint64
	alibiStride            *int64
	descaleStride          *[2]int64
	kv                     *KVCacheLayout
}

func (fc *featureCall) fields() featFields {
	if a := fc.fwd; a != nil {
		return featFields{&a.AlibiSlopes, &a.Sinks, &a.KDescale, &a.AlibiSlopesStride, &a.DescaleStride, &a.KV}
	}
	if a := fc.dec; a != nil {
		return featFields{&a.AlibiSlopes, &a.Sinks, &a.KDescale, &a.AlibiSlopesStride, &a.DescaleStride, &a.KV}
	}
	return featFields{new(uint64), &fc.red.Sinks, new(uint64), new(int64), new([2]int64), nil}
}

// featShape holds a line's sizes and config keys.
type featShape struct {
	batch, sq, sk, hq, hkv, d, dv int
	dt, kvdt, qdt                 DType
	causal                        bool
	window                        *Window
	softcap                       float64
	seed                          int64
}

var featFP8 = map[string]DType{"": 0, "e4m3": FP8E4M3, "e5m2": FP8E5M2}

func (c *featureCase) shape(op string) featShape {
	s := featShape{batch: c.num("batch", 1), sq: c.num("seqlen_q", required), hq: c.num("num_heads_q", required)}
	s.hkv = c.num("num_heads_kv", s.hq)
	if op == "reduce" {
		s.dv = c.num("head_dim_v", required)
		s.d = c.num("head_dim", s.dv)
	} else {
		s.sk = c.num("seqlen_k", required)
		s.d = c.num("head_dim", required)
		s.dv = c.num("head_dim_v", s.d)
	}
	s.dt = FP16
	if c.enum("dtype", "fp16", "fp16", "bf16") == "bf16" {
		s.dt = BF16
	}
	s.kvdt = featFP8[c.enum("kv_dtype", "", "e4m3", "e5m2")]
	s.qdt = featFP8[c.enum("q_dtype", "", "e4m3", "e5m2")]
	s.causal = c.enum("causal", "0", "0", "1") == "1"
	if wl, wr := c.num("window_left", -1), c.num("window_right", -1); wl != -1 || wr != -1 {
		s.window = &Window{int32(wl), int32(wr)}
	}
	s.softcap = c.float("softcap")
	s.seed = int64(c.num("seed", 0))
	return s
}

func (s featShape) config(t *testing.T) *Config {
	return newCfg(t, ConfigDesc{DType: s.dt, HeadDim: int32(s.d), HeadDimV: int32(s.dv), NumHeadsQ: int32(s.hq),
		NumHeadsKV: int32(s.hkv), Causal: s.causal, Window: s.window, Softcap: float32(s.softcap),
		KVDType: s.kvdt, QDType: s.qdt})
}

func (s featShape) problem() problem {
	return problem{batch: s.batch, sq: s.sq, skMax: s.sk, hq: s.hq, hkv: s.hkv, d: s.d, dv: s.dv,
		causal: s.causal, window: s.window, scale: 1 / math.Sqrt(float64(s.d)), softcap: s.softcap}
}

// tol is the O tolerance (absolute, plus 1e-2 relative in compareODType).
func (s featShape) tol() float64 {
	switch {
	case s.dt == BF16:
		return 2.5e-2
	case s.kvdt != 0:
		return 4e-3
	}
	return 3e-3
}

func buildFeatureCall(t *testing.T, rt *Runtime, c *featureCase, op string) *featureCall {
	t.Helper()
	s := c.shape(op)
	r := rand.New(rand.NewSource(s.seed))
	fc := &featureCall{rt: rt, s: s}
	if len(c.errs) > 0 { // sizes missing or not numbers: nothing to build
		t.Fatalf("%s: %s", c.where, strings.Join(c.errs, "; "))
	}
	fc.cfg = s.config(t)
	switch op {
	case "forward":
		buildForward(t, fc, c, s, r)
	case "decode":
		buildDecode(t, fc, c, s, r)
	default:
		buildReduce(t, fc, c, s, r)
	}
	return fc
}

// featFmt is a tensor's element format on the host: raw little-endian bytes.
type featFmt DType

func (f featFmt) size() int {
	if f == featFmt(FP8E4M3) || f == featFmt(FP8E5M2) {
		return 1
	}
	return 2
}

// put stores x (for fp8: x / descale in fp32, rounded to nearest even,
// saturated) as element i and returns the value it holds (fp8: times descale).
func (f featFmt) put(raw []byte, i int, x, descale float64) float32 {
	switch DType(f) {
	case FP8E4M3, FP8E5M2:
		raw[i] = fp8Quantize(float64(float32(x)/float32(descale)), DType(f) == FP8E5M2)
	case BF16:
		h := Float32ToBF16(float32(x))
		raw[2*i], raw[2*i+1] = byte(h), byte(h>>8)
	default:
		h := Float32ToFP16(float32(x))
		raw[2*i], raw[2*i+1] = byte(h), byte(h>>8)
	}
	return f.get(raw, i, descale)
}

// get is the value of element i.
func (f featFmt) get(raw []byte, i int, descale float64) float32 {
	switch DType(f) {
	case FP8E4M3, FP8E5M2:
		return float32(fp8Value(raw[i], DType(f) == FP8E5M2) * descale)
	case BF16:
		return BF16ToFloat32(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
	}
	return FP16ToFloat32(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
}

// ulp is the relative spacing of the format's numbers.
func (f featFmt) ulp() float64 {
	switch DType(f) {
	case FP8E4M3:
		return 1.0 / 8
	case FP8E5M2:
		return 1.0 / 4
	case BF16:
		return 1.0 / 128
	}
	return 1.0 / 1024
}

// tensor4 is a host tensor [batch, s, h, dim] of format f.
type tensor4 struct {
	f             featFmt
	s, h, dim     int
	raw           []byte
	val           []float32
	ds            []float32 // descales or nil (1)
	dsStr         [2]int64
	group         int // heads per descale head
	batchElements int
}

// descale of element i: (b, head / group) of ds.
func (x *tensor4) descale(i int) float64 {
	if x.ds == nil || x.f.size() == 2 {
		return 1
	}
	b, h := i/x.batchElements, i/x.dim%x.h/x.group
	return float64(x.ds[int64(b)*x.dsStr[0]+int64(h)*x.dsStr[1]])
}

// newTensor4 draws standard normal values (divided by the descale for fp8)
// rounded to f.
func newTensor4(r *rand.Rand, f featFmt, batch, s, h, dim int, ds *featDescale, dsv []float32, group int) *tensor4 {
	x := &tensor4{f: f, s: s, h: h, dim: dim, ds: dsv, group: group, batchElements: s * h * dim}
	if ds != nil {
		x.dsStr = ds.stride
	}
	x.raw = make([]byte, batch*s*h*dim*f.size())
	x.val = make([]float32, batch*s*h*dim)
	for i := range x.val {
		x.val[i] = f.put(x.raw, i, r.NormFloat64(), x.descale(i))
	}
	return x
}

// poisonTail fills token rows from[b].. of sequence b with NaN (0xff bytes
// are NaN in every format).
func (x *tensor4) poisonTail(from []int) {
	row, es := x.h*x.dim, x.f.size()
	for b, n := range from {
		for i := (b*x.s + n) * row; i < (b+1)*x.s*row; i++ {
			x.val[i] = float32(math.NaN())
			for j := 0; j < es; j++ {
				x.raw[i*es+j] = 0xff
			}
		}
	}
}

func (x *tensor4) upload(t *testing.T, rt *Runtime) *DeviceMemory {
	return upload(t, rt, bytesAsUint16(x.raw))
}

// featDescale holds fp8 descales (descale=tensor|batch_heads).
type featDescale struct {
	q, k, v []float32
	stride  [2]int64
}

func fp8Max(f DType) float64 {
	if f == FP8E5M2 {
		return 57344
	}
	return 448
}

func newDescales(c *featureCase, r *rand.Rand, s featShape) *featDescale {
	mode := c.enum("descale", "", "tensor", "batch_heads")
	if mode == "" {
		return nil
	}
	n, ds := 1, &featDescale{}
	if mode == "batch_heads" {
		n, ds.stride = s.batch*s.hkv, [2]int64{int64(s.hkv), 1}
	}
	gen := func(f DType) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(4 / fp8Max(f) * (0.5 + 1.5*r.Float64()))
		}
		return v
	}
	ds.k, ds.v = gen(s.kvdt), gen(s.kvdt)
	if s.qdt != 0 {
		ds.q = gen(s.qdt)
	}
	return ds
}

// featExtras: ALiBi slopes and sinks of a forward or decode line.
type featExtras struct {
	alibi, sinks uint64
	alibiStride  int64
	sinkVals     []float32
}

func newExtras(t *testing.T, rt *Runtime, c *featureCase, r *rand.Rand, s featShape, p *problem) featExtras {
	var e featExtras
	if mode := c.enum("alibi_slopes", "", "heads", "batch"); mode != "" {
		n := s.hq
		if mode == "batch" {
			n, e.alibiStride = s.batch*s.hq, int64(s.hq)
		}
		p.alibi, p.alibiStride = make([]float32, n), int(e.alibiStride)
		for i := range p.alibi {
			p.alibi[i] = float32(0.01 + 0.49*r.Float64())
		}
		e.alibi = upload(t, rt, p.alibi).Ptr()
	}
	if c.enum("sinks", "", "random") != "" {
		e.sinkVals = make([]float32, s.hq)
		for i := range e.sinkVals {
			e.sinkVals[i] = float32(-2 + 8*r.Float64())
		}
		if s.hq > 1 {
			e.sinkVals[1] = float32(math.Inf(-1))
		}
		e.sinks = upload(t, rt, e.sinkVals).Ptr()
	}
	return e
}

// withSinks turns the plain softmax's O and LSE into the sink softmax: the
// sink is one more term e^sink[h] of each row's denominator with no value
// (LSE' = logaddexp(LSE, sink), O' = O e^(LSE - LSE')).
func withSinks(p problem, o, lse []float64, sinks []float32) ([]float64, []float64) {
	if sinks == nil {
		return o, lse
	}
	o2 := append([]float64(nil), o...)
	lse2 := append([]float64(nil), lse...)
	for b := 0; b < p.batch; b++ {
		for h := 0; h < p.hq; h++ {
			for i := 0; i < p.sq; i++ {
				li := (b*p.hq+h)*p.sq + i
				l, s := lse[li], float64(sinks[h])
				m := math.Max(l, s)
				if math.IsInf(m, -1) {
					continue // no key and no sink: O = 0, LSE = -inf
				}
				n := m + math.Log(math.Exp(l-m)+math.Exp(s-m))
				lse2[li] = n
				f := 0.0
				if !math.IsInf(l, -1) {
					f = math.Exp(l - n)
				}
				for c := 0; c < p.dv; c++ {
					o2[((b*p.sq+i)*p.hq+h)*p.dv+c] *= f
				}
			}
		}
	}
	return o2, lse2
}

// featOut is a poisoned O [batch, sq, hq, dv] of dtype dt and LSE.
type featOut struct {
	o, lse *DeviceMemory
	n, nl  int
	dt     DType
}

func newFeatOut(t *testing.T, rt *Runtime, s featShape) featOut {
	n, nl := s.batch*s.sq*s.hq*s.dv, s.batch*s.hq*s.sq
	return featOut{o: poisoned(t, rt, uint64(n)*2), lse: poisoned(t, rt, uint64(nl)*4), n: n, nl: nl, dt: s.dt}
}

// values downloads O (as float64) and LSE.
func (out featOut) values(t *testing.T) ([]float64, []float32) {
	bits := make([]uint16, out.n)
	lse := make([]float32, out.nl)
	if err := out.o.DownloadUint16(bits); err != nil {
		t.Fatal(err)
	}
	if err := out.lse.DownloadFloat32(lse); err != nil {
		t.Fatal(err)
	}
	return decodeBits(out.dt, bits), lse
}

// untouched checks a rejected call wrote nothing: O and LSE hold the poison.
func (out featOut) untouched(t *testing.T) {
	t.Helper()
	o, lse := out.values(t)
	for i, x := range o {
		if !math.IsNaN(x) {
			t.Fatalf("O[%d] = %v written by a rejected call", i, x)
		}
	}
	for i, x := range lse {
		if math.Float32bits(x) != 0xffffffff {
			t.Fatalf("LSE[%d] = %v written by a rejected call", i, x)
		}
	}
}

// compare checks O and LSE against the reference.
func (out featOut) compare(t *testing.T, what string, want, wantLSE []float64, tol float64) {
	t.Helper()
	got, lse := out.values(t)
	compareValues(t, what+" O", got, want, tol)
	compareLSE(t, what+" LSE", lse, wantLSE)
}

// kvStore places a logical cache [batch, skMax, heads, dim] into a layout
// (kv_layout): one contiguous buffer, shuffled pages (spare pages NaN), or
// one buffer per sequence of caps[b] rows.
type kvStore struct {
	layout             string
	batch, skMax       int
	pageSize, maxPages int
	numPages           int
	table              []int32
	caps               []int
}

func newKVStore(c *featureCase, r *rand.Rand, batch, skMax int, caps []int) *kvStore {
	st := &kvStore{layout: c.enum("kv_layout", "contiguous", "contiguous", "paged", "ptr_array"),
		batch: batch, skMax: skMax, caps: caps}
	if st.layout != "paged" {
		return st
	}
	st.pageSize = c.num("page_size", 16)
	if st.pageSize < 1 {
		c.fail("page_size=%d", st.pageSize)
		return st
	}
	st.maxPages = (skMax + st.pageSize - 1) / st.pageSize
	st.numPages = batch*st.maxPages + 3
	perm := r.Perm(st.numPages)
	st.table = make([]int32, batch*st.maxPages)
	for i := range st.table {
		st.table[i] = int32(perm[i])
	}
	return st
}

// loc is where token j of sequence b lives: buffer and token row.
func (st *kvStore) loc(b, j int) (buf, row int, ok bool) {
	switch st.layout {
	case "paged":
		return 0, int(st.table[b*st.maxPages+j/st.pageSize])*st.pageSize + j%st.pageSize, true
	case "ptr_array":
		return b, j, j < st.caps[b]
	}
	return 0, b*st.skMax + j, true
}

// place lays out x's bytes; rows no key maps to are NaN.
func (st *kvStore) place(x *tensor4) [][]byte {
	rowBytes := x.h * x.dim * x.f.size()
	var bufs [][]byte
	switch st.layout {
	case "paged":
		bufs = [][]byte{make([]byte, st.numPages*st.pageSize*rowBytes)}
	case "ptr_array":
		for _, n := range st.caps {
			bufs = append(bufs, make([]byte, maxInt(n, 1)*rowBytes))
		}
	default:
		bufs = [][]byte{make([]byte, st.batch*st.skMax*rowBytes)}
	}
	for _, b := range bufs {
		for i := range b {
			b[i] = 0xff
		}
	}
	for b := 0; b < st.batch; b++ {
		for j := 0; j < st.skMax; j++ {
			if buf, row, ok := st.loc(b, j); ok {
				copy(bufs[buf][row*rowBytes:(row+1)*rowBytes], x.raw[(b*st.skMax+j)*rowBytes:])
			}
		}
	}
	return bufs
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// kvDevice is a placed K and V on the device.
type kvDevice struct {
	kBufs, vBufs [][]byte // as uploaded
	k, v         []*DeviceMemory
	layout       KVCacheLayout
	kT, vT       Tensor
}

func (st *kvStore) upload(t *testing.T, rt *Runtime, k, v *tensor4) *kvDevice {
	d := &kvDevice{kBufs: st.place(k), vBufs: st.place(v)}
	for i := range d.kBufs {
		d.k = append(d.k, upload(t, rt, bytesAsUint16(d.kBufs[i])))
		d.v = append(d.v, upload(t, rt, bytesAsUint16(d.vBufs[i])))
	}
	switch st.layout {
	case "paged":
		d.layout = Paged(upload(t, rt, st.table).Ptr(), int32(st.pageSize), int32(st.numPages), int32(st.maxPages))
		d.kT = Contiguous(d.k[0].Ptr(), int64(st.pageSize), int64(k.h), int64(k.dim))
		d.vT = Contiguous(d.v[0].Ptr(), int64(st.pageSize), int64(v.h), int64(v.dim))
	case "ptr_array":
		kp, vp := make([]uint64, st.batch), make([]uint64, st.batch)
		for b := range kp {
			kp[b], vp[b] = d.k[b].Ptr(), d.v[b].Ptr()
		}
		d.layout = PtrArray(upload(t, rt, kp).Ptr(), upload(t, rt, vp).Ptr())
		d.kT, d.vT = SeqTensor(int64(k.h), int64(k.dim)), SeqTensor(int64(v.h), int64(v.dim))
	default:
		d.kT = Contiguous(d.k[0].Ptr(), int64(st.skMax), int64(k.h), int64(k.dim))
		d.vT = Contiguous(d.v[0].Ptr(), int64(st.skMax), int64(v.h), int64(v.dim))
	}
	return d
}

// downloadBytes reads back len(like) bytes of m.
func downloadBytes(t *testing.T, m *DeviceMemory, like []byte) []byte {
	t.Helper()
	words := make([]uint16, (len(like)+1)/2)
	if err := m.DownloadUint16(words); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, len(like))
	for i := range out {
		out[i] = byte(words[i/2] >> (8 * (i % 2)))
	}
	return out
}

func buildForward(t *testing.T, fc *featureCall, c *featureCase, s featShape, r *rand.Rand) {
	ds := newDescales(c, r, s)
	var qds, kds, vds []float32
	if ds != nil {
		qds, kds, vds = ds.q, ds.k, ds.v
	}
	qf, kvf := featFmt(s.dt), featFmt(s.dt)
	if s.qdt != 0 {
		qf = featFmt(s.qdt)
	}
	if s.kvdt != 0 {
		kvf = featFmt(s.kvdt)
	}
	q := newTensor4(r, qf, s.batch, s.sq, s.hq, s.d, ds, qds, s.hq/s.hkv)
	k := newTensor4(r, kvf, s.batch, s.sk, s.hkv, s.d, ds, kds, 1)
	v := newTensor4(r, kvf, s.batch, s.sk, s.hkv, s.dv, ds, vds, 1)
	caps := make([]int, s.batch)
	for b := range caps {
		caps[b] = s.sk
	}
	kv := newKVStore(c, r, s.batch, s.sk, caps).upload(t, fc.rt, k, v)
	p := s.problem()
	p.kvLen = caps
	ex := newExtras(t, fc.rt, c, r, s, &p)
	out := newFeatOut(t, fc.rt, s)
	fc.out = out
	fc.fwd = &ForwardArgs{Batch: int32(s.batch), SeqlenQ: int32(s.sq), SeqlenK: int32(s.sk),
		Q: Contiguous(q.upload(t, fc.rt).Ptr(), int64(s.sq), int64(s.hq), int64(s.d)), K: kv.kT, V: kv.vT,
		O:   Contiguous(out.o.Ptr(), int64(s.sq), int64(s.hq), int64(s.dv)),
		LSE: out.lse.Ptr(), KV: kv.layout, Sinks: ex.sinks, AlibiSlopes: ex.alibi, AlibiSlopesStride: ex.alibiStride}
	if ds != nil {
		fc.fwd.KDescale, fc.fwd.VDescale = upload(t, fc.rt, ds.k).Ptr(), upload(t, fc.rt, ds.v).Ptr()
		fc.fwd.DescaleStride = ds.stride
		if ds.q != nil {
			fc.fwd.QDescale = upload(t, fc.rt, ds.q).Ptr()
		}
	}
	fc.check = func(t *testing.T) {
		want, wantLSE := reference(p, q.val, k.val, v.val)
		want, wantLSE = withSinks(p, want, wantLSE, ex.sinkVals)
		if s.qdt == 0 {
			out.compare(t, "forward", want, wantLSE, s.tol())
			return
		}
		p.pFP8 = true
		yard, _ := reference(p, q.val, k.val, v.val)
		yard, _ = withSinks(p, yard, wantLSE, ex.sinkVals)
		got, lse := out.values(t)
		checkFP8Forward(t, got, want, yard)
		compareLSE(t, "fp8 forward LSE", lse, wantLSE)
	}
}

// checkFP8Forward: O within twice the error of the attention with P rounded
// as the kernel rounds it (the yardstick; its O is not rounded to the dtype:
// 1e-3 more in max abs), in L2 and in max abs.
func checkFP8Forward(t *testing.T, got, want, yard []float64) {
	t.Helper()
	var err2, ref2, yard2, errMax, yardMax float64
	for i, g := range got {
		if math.IsNaN(g) || math.IsInf(g, 0) {
			t.Fatalf("O[%d] = %v", i, g)
		}
		d, y := g-want[i], yard[i]-want[i]
		err2, ref2, yard2 = err2+d*d, ref2+want[i]*want[i], yard2+y*y
		errMax, yardMax = math.Max(errMax, math.Abs(d)), math.Max(yardMax, math.Abs(y))
	}
	if math.Sqrt(err2) > math.Max(2*math.Sqrt(yard2), 1e-2*math.Sqrt(ref2)) {
		t.Fatalf("L2 error %.3g over twice the yardstick's %.3g (|ref| %.3g)", math.Sqrt(err2),
			math.Sqrt(yard2), math.Sqrt(ref2))
	}
	if errMax > 2*yardMax+1e-3 {
		t.Fatalf("max abs error %.3g over twice the yardstick's %.3g + 1e-3", errMax, yardMax)
	}
	t.Logf("fp8 forward: max abs err %.3g (yardstick %.3g), L2 %.3g (yardstick %.3g)", errMax, yardMax,
		math.Sqrt(err2), math.Sqrt(yard2))
}

// featTrees draws tree_mask masks [trees][sq][sq]: a random tree per
// sequence (batch) or one (shared), or the chain.
func featTrees(c *featureCase, r *rand.Rand, batch, sq int) ([]bool, int) {
	mode := c.enum("tree_mask", "", "batch", "shared", "chain")
	trees := batch
	switch mode {
	case "":
		return nil, 0
	case "shared", "chain":
		trees = 1
	}
	m := make([]bool, trees*sq*sq)
	for tr := 0; tr < trees; tr++ {
		parent := make([]int, sq)
		for i := 0; i < sq; i++ {
			parent[i] = i - 1 // the chain
			if i == 0 {
				parent[i] = -1
			} else if mode != "chain" {
				parent[i] = r.Intn(i)
			}
			for j := i; j >= 0; j = parent[j] {
				m[(tr*sq+i)*sq+j] = true
			}
		}
	}
	return m, trees
}

// rope64 rotates one row x [d] at position pos in float64 (cos/sin [_, rd/2]).
func rope64(x []float32, pos int, cos, sin []float32, rd int, interleaved bool) []float64 {
	half := rd / 2
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	for i := 0; i < half; i++ {
		c, s := float64(cos[pos*half+i]), float64(sin[pos*half+i])
		i0, i1 := i, i+half
		if interleaved {
			i0, i1 = 2*i, 2*i+1
		}
		x0, x1 := float64(x[i0]), float64(x[i1])
		y[i0] = x0*c - x1*s
		y[i1] = x0*s + x1*c
	}
	return y
}

// featAppend is a decode's KV append: new keys and values, rotary tables.
type featAppend struct {
	n, rd       int
	interleaved bool
	kn, vn      *tensor4
	cos, sin    []float32
}

func newAppend(c *featureCase, r *rand.Rand, s featShape) *featAppend {
	a := &featAppend{n: c.num("seqlen_new", 0), rd: c.num("rotary_dim", 0),
		interleaved: c.enum("rotary_interleaved", "0", "0", "1") == "1"}
	if a.n > 0 {
		a.kn = newTensor4(r, featFmt(s.dt), s.batch, a.n, s.hkv, s.d, nil, nil, 1)
		a.vn = newTensor4(r, featFmt(s.dt), s.batch, a.n, s.hkv, s.dv, nil, nil, 1)
	}
	for i := 0; i < s.sk*a.rd/2; i++ {
		th := 2 * math.Pi * r.Float64()
		a.cos, a.sin = append(a.cos, float32(math.Cos(th))), append(a.sin, float32(math.Sin(th)))
	}
	return a
}

func buildDecode(t *testing.T, fc *featureCall, c *featureCase, s featShape, r *rand.Rand) {
	lens := c.list("cache_seqlens", s.batch, s.sk)
	splits := c.num("num_splits", 1)
	ds := newDescales(c, r, s)
	var kds, vds []float32
	if ds != nil {
		kds, vds = ds.k, ds.v
	}
	kvf := featFmt(s.dt)
	if s.kvdt != 0 {
		kvf = featFmt(s.kvdt)
	}
	q := newTensor4(r, featFmt(s.dt), s.batch, s.sq, s.hq, s.d, nil, nil, 1)
	k := newTensor4(r, kvf, s.batch, s.sk, s.hkv, s.d, ds, kds, 1)
	v := newTensor4(r, kvf, s.batch, s.sk, s.hkv, s.dv, ds, vds, 1)
	k.poisonTail(lens)
	v.poisonTail(lens)
	ap := newAppend(c, r, s)
	p := s.problem()
	p.kvLen = make([]int, s.batch)
	lens32 := make([]int32, s.batch)
	for b, l := range lens {
		p.kvLen[b], lens32[b] = l+ap.n, int32(l)
	}
	tree, trees := featTrees(c, r, s.batch, s.sq)
	p.tree = tree
	ex := newExtras(t, fc.rt, c, r, s, &p)
	store := newKVStore(c, r, s.batch, s.sk, p.kvLen)
	kv := store.upload(t, fc.rt, k, v)
	out := newFeatOut(t, fc.rt, s)
	fc.out = out
	a := &DecodeArgs{Batch: int32(s.batch), SeqlenQ: int32(s.sq), SeqlenKMax: int32(s.sk),
		Q:      Contiguous(q.upload(t, fc.rt).Ptr(), int64(s.sq), int64(s.hq), int64(s.d)),
		KCache: kv.kT, VCache: kv.vT, CacheSeqlens: upload(t, fc.rt, lens32).Ptr(), NumSplits: int32(splits),
		O:   Contiguous(out.o.Ptr(), int64(s.sq), int64(s.hq), int64(s.dv)),
		LSE: out.lse.Ptr(), KV: kv.layout, Sinks: ex.sinks, AlibiSlopes: ex.alibi, AlibiSlopesStride: ex.alibiStride}
	if ds != nil {
		a.KDescale, a.VDescale = upload(t, fc.rt, ds.k).Ptr(), upload(t, fc.rt, ds.v).Ptr()
		a.DescaleStride = ds.stride
	}
	if tree != nil {
		words := (s.sq + 31) / 32
		a.TreeMask = uploadWords(t, fc.rt, PackTreeMask(tree, s.sq)).Ptr()
		a.TreeMaskStride = [2]int64{int64(s.sq * words * 4), int64(words * 4)}
		if trees == 1 {
			a.TreeMaskStride[0] = 0
		}
	}
	if ap.n > 0 {
		a.KNew = Contiguous(ap.kn.upload(t, fc.rt).Ptr(), int64(ap.n), int64(s.hkv), int64(s.d))
		a.VNew = Contiguous(ap.vn.upload(t, fc.rt).Ptr(), int64(ap.n), int64(s.hkv), int64(s.dv))
		a.SeqlenNew = int32(ap.n)
	}
	if ap.rd > 0 {
		a.RotaryDim, a.RotaryInterleaved, a.RotaryDType = int32(ap.rd), ap.interleaved, FP32
		a.RotaryCos, a.RotarySin = upload(t, fc.rt, ap.cos).Ptr(), upload(t, fc.rt, ap.sin).Ptr()
		a.SeqlenRo = int32(s.sk)
	}
	fc.dec = a
	fc.check = func(t *testing.T) {
		checkAppended(t, store, kv, k, ap.kn, lens, ap, true)
		checkAppended(t, store, kv, v, ap.vn, lens, ap, false)
		qv := q.val
		if ap.rd > 0 { // Q rotated at cache_seqlens[b] + t (causal or windowed), else cache_seqlens[b]
			qv = append([]float32(nil), q.val...)
			for b := 0; b < s.batch; b++ {
				for tq := 0; tq < s.sq; tq++ {
					pos := lens[b]
					if s.causal || s.window != nil {
						pos += tq
					}
					for h := 0; h < s.hq; h++ {
						i0 := ((b*s.sq+tq)*s.hq + h) * s.d
						for i, y := range rope64(q.val[i0:i0+s.d], pos, ap.cos, ap.sin, ap.rd, ap.interleaved) {
							qv[i0+i] = float32(y)
						}
					}
				}
			}
		}
		want, wantLSE := reference(p, qv, k.val, v.val)
		want, wantLSE = withSinks(p, want, wantLSE, ex.sinkVals)
		out.compare(t, "decode", want, wantLSE, s.tol())
	}
}

// checkAppended reads the K (isK) or V storage back: the rows of the new
// tokens hold them (V and unrotated K columns exactly the bytes put gives,
// rotated K columns within one ulp of the float64 rotation), every other
// byte is unchanged. The new rows' values go into x for the reference.
func checkAppended(t *testing.T, st *kvStore, d *kvDevice, x, nw *tensor4, lens []int, ap *featAppend, isK bool) {
	t.Helper()
	bufs, mem := d.vBufs, d.v
	if isK {
		bufs, mem = d.kBufs, d.k
	}
	rowBytes := x.h * x.dim * x.f.size()
	now := make([][]byte, len(bufs))
	for i := range bufs {
		now[i] = downloadBytes(t, mem[i], bufs[i])
	}
	isNew := map[[2]int]bool{}
	for b := 0; ap.n > 0 && b < st.batch; b++ {
		for tk := 0; tk < ap.n; tk++ {
			j := lens[b] + tk
			buf, row, ok := st.loc(b, j)
			if !ok {
				t.Fatalf("no storage for key %d of sequence %d", j, b)
			}
			isNew[[2]int{buf, row}] = true
			got := now[buf][row*rowBytes : (row+1)*rowBytes]
			checkNewRow(t, x, nw, got, b, j, tk, ap, isK)
		}
	}
	for i, buf := range bufs {
		for row := 0; row*rowBytes < len(buf); row++ {
			a, b := buf[row*rowBytes:(row+1)*rowBytes], now[i][row*rowBytes:(row+1)*rowBytes]
			if !isNew[[2]int{i, row}] && string(a) != string(b) {
				t.Fatalf("K=%v storage %d row %d changed", isK, i, row)
			}
		}
	}
}

// checkNewRow checks new token tk of sequence b (key j) in its stored row.
func checkNewRow(t *testing.T, x, nw *tensor4, got []byte, b, j, tk int, ap *featAppend, isK bool) {
	t.Helper()
	want := make([]byte, len(got))
	for h := 0; h < x.h; h++ {
		src := ((b*ap.n+tk)*x.h + h) * x.dim
		dst := ((b*x.s+j)*x.h + h) * x.dim
		var rot []float64
		if isK && ap.rd > 0 {
			rot = rope64(nw.val[src:src+x.dim], j, ap.cos, ap.sin, ap.rd, ap.interleaved)
		}
		for c := 0; c < x.dim; c++ {
			e, ds := h*x.dim+c, x.descale(dst+c)
			x.val[dst+c] = x.f.get(got, e, ds)
			if rot == nil || c >= ap.rd {
				x.f.put(want, e, float64(nw.val[src+c]), ds)
				es := x.f.size()
				if string(got[e*es:(e+1)*es]) != string(want[e*es:(e+1)*es]) {
					t.Fatalf("K=%v [%d][%d][%d][%d] = %v, want %v (the new token %d)", isK, b, j, h, c,
						x.val[dst+c], x.f.get(want, e, ds), tk)
				}
				continue
			}
			g, w := float64(x.val[dst+c]), rot[c]
			if !(math.Abs(g-w) <= x.f.ulp()*math.Abs(w)+1e-6+ds*1e-3*x.f.ulp()) {
				t.Fatalf("rotated k[%d][%d][%d][%d] = %v, want %v", b, j, h, c, g, w)
			}
		}
	}
}

// buildReduce: random partial states, natural LSEs uniform in [-6, 6]
// (handed over in lse_partial_format) with one empty split in row 1 and a
// last row with no state, merged in float64.
func buildReduce(t *testing.T, fc *featureCall, c *featureCase, s featShape, r *rand.Rand) {
	S := c.num("num_splits", 1)
	inF := c.enum("lse_partial_format", "natural", "natural", "base2")
	outF := c.enum("lse_format", "natural", "natural", "base2")
	B, SQ, H, DV := s.batch, s.sq, s.hq, s.dv
	rows := B * H * SQ
	op := make([]float32, S*B*SQ*H*DV)
	for i := range op {
		op[i] = float32(r.NormFloat64())
	}
	lp := make([]float32, S*rows)
	asNat := make([]float64, len(lp)) // the natural logs the values stand for
	for i := range lp {
		x := float32(12*r.Float64() - 6)
		if (i%rows == 1 && i/rows == S-1) || i%rows == rows-1 {
			x = float32(math.Inf(-1))
		}
		lp[i], asNat[i] = x, float64(x)
		if inF == "base2" {
			lp[i] = float32(float64(x) * math.Log2E)
			asNat[i] = float64(lp[i]) / math.Log2E
		}
	}
	p := problem{batch: B, sq: SQ, hq: H, dv: DV}
	ex := newExtras(t, fc.rt, c, r, s, &p)
	if p.alibi != nil {
		c.fail("alibi_slopes: reduce has none")
	}
	out := newFeatOut(t, fc.rt, s)
	fc.out = out
	fc.red = &ReduceArgs{NumSplits: int32(S), Batch: int32(B), SeqlenQ: int32(SQ),
		OPartial:         upload(t, fc.rt, op).Ptr(),
		OPartialStride:   [5]int64{int64(B * SQ * H * DV), int64(SQ * H * DV), int64(H * DV), int64(DV), 1},
		LSEPartial:       upload(t, fc.rt, lp).Ptr(),
		LSEPartialStride: [4]int64{int64(rows), int64(H * SQ), int64(SQ), 1},
		O:                Contiguous(out.o.Ptr(), int64(SQ), int64(H), int64(DV)), LSE: out.lse.Ptr(),
		Sinks: ex.sinks, LSEPartialFormat: map[string]LSEFormat{"natural": LSENatural, "base2": LSEBase2}[inF],
		LSEFormat: map[string]LSEFormat{"natural": LSENatural, "base2": LSEBase2}[outF]}
	fc.check = func(t *testing.T) {
		want := make([]float64, B*SQ*H*DV)
		wantLSE := make([]float64, rows)
		for b := 0; b < B; b++ {
			for h := 0; h < H; h++ {
				for tq := 0; tq < SQ; tq++ {
					li := (b*H+h)*SQ + tq
					m := math.Inf(-1)
					for sp := 0; sp < S; sp++ {
						m = math.Max(m, asNat[sp*rows+li])
					}
					sink := math.Inf(-1)
					if ex.sinkVals != nil {
						sink = float64(ex.sinkVals[h])
					}
					if m = math.Max(m, sink); math.IsInf(m, -1) {
						wantLSE[li] = m
						continue
					}
					sum := math.Exp(sink - m)
					oi := ((b*SQ+tq)*H + h) * DV
					for sp := 0; sp < S; sp++ {
						w := math.Exp(asNat[sp*rows+li] - m)
						sum += w
						for c := 0; c < DV; c++ {
							want[oi+c] += w * float64(op[sp*B*SQ*H*DV+oi+c])
						}
					}
					for c := 0; c < DV; c++ {
						want[oi+c] /= sum
					}
					wantLSE[li] = m + math.Log(sum)
					if outF == "base2" {
						wantLSE[li] *= math.Log2E
					}
				}
			}
		}
		out.compare(t, "reduce", want, wantLSE, 1e-3)
	}
}

// fp8Values[e5m2][code] is the value of every fp8 code (OCP e4m3: bias 7, no
// infinities, S.1111.111 NaN; e5m2: bias 15, exponent 31 NaN here).
var fp8Values = func() (v [2][256]float64) {
	for f, e5m2 := range []bool{false, true} {
		mb, bias := 3, 7
		if e5m2 {
			mb, bias = 2, 15
		}
		for code := 0; code < 256; code++ {
			e, m, sign := code&0x7f>>mb, float64(code&(1<<mb-1)), 1.0
			if code&0x80 != 0 {
				sign = -1
			}
			switch {
			case (e5m2 && e == 31) || (!e5m2 && e == 15 && m == 7):
				v[f][code] = math.NaN()
			case e == 0:
				v[f][code] = sign * m * math.Pow(2, float64(1-bias-mb))
			default:
				v[f][code] = sign * (float64(int(1)<<mb) + m) * math.Pow(2, float64(e-bias-mb))
			}
		}
	}
	return v
}()

// fp8Value is the value of an fp8 code.
func fp8Value(code uint8, e5m2 bool) float64 {
	if e5m2 {
		return fp8Values[1][code]
	}
	return fp8Values[0][code]
}

// fp8Quantize rounds x to the nearest fp8 code, ties to even, saturating at
// the largest finite (cvt.rn.satfinite); NaN gives NaN.
func fp8Quantize(x float64, e5m2 bool) uint8 {
	top := 0x7e
	if e5m2 {
		top = 0x7b
	}
	if math.IsNaN(x) {
		return 0x7f
	}
	var sign uint8
	if math.Signbit(x) {
		sign, x = 0x80, -x
	}
	c := sort.Search(top+1, func(c int) bool { return fp8Value(uint8(c), e5m2) >= x })
	if c > top {
		return sign | uint8(top)
	}
	if c > 0 {
		lo, hi := fp8Value(uint8(c-1), e5m2), fp8Value(uint8(c), e5m2)
		if x-lo < hi-x || (x-lo == hi-x && (c-1)%2 == 0) {
			c--
		}
	}
	return sign | uint8(c)
}

// bytesAsUint16 packs bytes into little-endian uint16 pairs for upload.
func bytesAsUint16(b []uint8) []uint16 {
	out := make([]uint16, (len(b)+1)/2)
	for i, x := range b {
		out[i/2] |= uint16(x) << (8 * (i % 2))
	}
	return out
}

// uploadWords uploads 32-bit words (a packed tree mask).
func uploadWords(t *testing.T, rt *Runtime, w []uint32) *DeviceMemory {
	t.Helper()
	s := make([]int32, len(w))
	for i, x := range w {
		s[i] = int32(x)
	}
	return upload(t, rt, s)
}
