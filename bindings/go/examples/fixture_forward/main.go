// Command fixture_forward runs the flashattn forward pass on the emulator
// over a real model's attention inputs (tests/data/minilm_l6: q, k, v
// float32 [1, 145, 12, 32]) in fp16 and compares the result with the
// model's attention output out.npy. It prints the max abs error and PASS
// when max_abs <= 1e-2 * max(1, max|ref|), else FAIL (exit status 1).
//
//	go run ./examples/fixture_forward [FIXTURE_DIR]
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"flashattn.dev/flashattn"
)

// readNpy reads a little-endian float32, C-order .npy file (format 1.0 or
// 2.0) and returns its shape and data.
func readNpy(path string) ([]int, []float32, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	if len(b) < 10 || string(b[:6]) != "\x93NUMPY" {
		return nil, nil, fmt.Errorf("%s: not a .npy file", path)
	}
	var hlen, off int
	switch b[6] {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(b[8:10])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, nil, fmt.Errorf("%s: truncated header", path)
		}
		hlen, off = int(binary.LittleEndian.Uint32(b[8:12])), 12
	default:
		return nil, nil, fmt.Errorf("%s: unsupported .npy version %d", path, b[6])
	}
	if off+hlen > len(b) {
		return nil, nil, fmt.Errorf("%s: truncated header", path)
	}
	header := string(b[off : off+hlen])
	if !regexp.MustCompile(`'descr':\s*'<f4'`).MatchString(header) {
		return nil, nil, fmt.Errorf("%s: dtype is not little-endian float32: %s", path, header)
	}
	if !regexp.MustCompile(`'fortran_order':\s*False`).MatchString(header) {
		return nil, nil, fmt.Errorf("%s: not C-order", path)
	}
	m := regexp.MustCompile(`'shape':\s*\(([^)]*)\)`).FindStringSubmatch(header)
	if m == nil {
		return nil, nil, fmt.Errorf("%s: no shape in header", path)
	}
	var shape []int
	n := 1
	for _, f := range strings.Split(m[1], ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: bad shape %q", path, m[1])
		}
		shape = append(shape, d)
		n *= d
	}
	data := b[off+hlen:]
	if len(data) != 4*n {
		return nil, nil, fmt.Errorf("%s: %d data bytes for %d elements", path, len(data), n)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return shape, out, nil
}

// upload copies fp16 values into new device memory.
func upload(rt *flashattn.Runtime, v []uint16) (*flashattn.DeviceMemory, error) {
	m, err := rt.Malloc(uint64(len(v)) * 2)
	if err != nil {
		return nil, err
	}
	if err := m.UploadUint16(v); err != nil {
		m.Free()
		return nil, err
	}
	return m, nil
}

func run(dir string) error {
	names := []string{"q", "k", "v", "out"}
	shapes := make([][]int, 4)
	data := make([][]float32, 4)
	for i, n := range names {
		s, d, err := readNpy(filepath.Join(dir, n+".npy"))
		if err != nil {
			return err
		}
		if len(s) != 4 || s[0] != 1 {
			return fmt.Errorf("%s.npy: want shape [1, seqlen, heads, head_dim], got %v", n, s)
		}
		shapes[i], data[i] = s, d
	}
	seq, heads, dim := shapes[0][1], shapes[0][2], shapes[0][3]
	for i := 1; i < 4; i++ {
		if fmt.Sprint(shapes[i]) != fmt.Sprint(shapes[0]) {
			return fmt.Errorf("%s.npy shape %v differs from q %v", names[i], shapes[i], shapes[0])
		}
	}

	rt, err := flashattn.NewRuntime(&flashattn.RuntimeOptions{Backend: flashattn.BackendEmulator})
	if err != nil {
		return err
	}
	defer rt.Close()
	cfg, err := flashattn.NewConfig(flashattn.ConfigDesc{
		DType: flashattn.FP16, HeadDim: int32(dim), NumHeadsQ: int32(heads), NumHeadsKV: int32(heads),
	}) // non-causal, default scale 1/sqrt(head_dim)
	if err != nil {
		return err
	}
	defer cfg.Close()

	var mem [3]*flashattn.DeviceMemory
	for i := 0; i < 3; i++ {
		if mem[i], err = upload(rt, flashattn.ToFP16(data[i])); err != nil {
			return err
		}
		defer mem[i].Free()
	}
	o, err := rt.Malloc(uint64(len(data[3])) * 2)
	if err != nil {
		return err
	}
	defer o.Free()
	if err := o.Memset(0xff); err != nil { // NaN poison: unwritten outputs fail
		return err
	}
	s, h, d := int64(seq), int64(heads), int64(dim)
	err = rt.Forward(cfg, &flashattn.ForwardArgs{
		Batch: 1, SeqlenQ: int32(seq), SeqlenK: int32(seq),
		Q: flashattn.Contiguous(mem[0].Ptr(), s, h, d),
		K: flashattn.Contiguous(mem[1].Ptr(), s, h, d),
		V: flashattn.Contiguous(mem[2].Ptr(), s, h, d),
		O: flashattn.Contiguous(o.Ptr(), s, h, d),
	})
	if err != nil {
		return err
	}
	bits := make([]uint16, len(data[3]))
	if err := o.DownloadUint16(bits); err != nil {
		return err
	}
	got := flashattn.FromFP16(bits)

	maxAbs, maxRef := 0.0, 0.0
	for i, r := range data[3] {
		d := math.Abs(float64(got[i]) - float64(r))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		maxAbs = math.Max(maxAbs, d)
		maxRef = math.Max(maxRef, math.Abs(float64(r)))
	}
	tol := 1e-2 * math.Max(1, maxRef)
	fmt.Printf("fixture %s: [1, %d, %d, %d] fp16 forward on the emulator\n", filepath.Base(dir), seq, heads, dim)
	fmt.Printf("max abs error %.3g (max |ref| %.3g, tolerance %.3g)\n", maxAbs, maxRef, tol)
	if !(maxAbs <= tol) {
		return errors.New("FAIL")
	}
	fmt.Println("PASS")
	return nil
}

func main() {
	dir := filepath.Join("..", "..", "tests", "data", "minilm_l6")
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	if err := run(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if err.Error() == "FAIL" {
			fmt.Println("FAIL")
		}
		os.Exit(1)
	}
}
