package flashattn

import "math"

// Float32ToFP16 rounds f to IEEE binary16 (round to nearest even),
// returning its bits; overflow gives ±Inf, NaN stays NaN.
func Float32ToFP16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff { // Inf or NaN
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // biased binary16 exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 { // subnormal binary16 (or zero)
		if e < -10 {
			return sign
		}
		m := man | 0x800000 // implicit bit
		shift := uint32(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++ // may carry into the smallest normal: still correct bits
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent rounds up to the next binade or Inf
	}
	return sign | uint16(h)
}

// FP16ToFloat32 widens binary16 bits to float32 (exact).
func FP16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: value = man * 2^-24.
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// Float32ToBF16 rounds f to bfloat16 (round to nearest even).
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // quiet NaN
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BF16ToFloat32 widens bfloat16 bits to float32 (exact).
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// ToFP16 converts a slice to binary16 bits.
func ToFP16(src []float32) []uint16 {
	out := make([]uint16, len(src))
	for i, f := range src {
		out[i] = Float32ToFP16(f)
	}
	return out
}

// FromFP16 converts binary16 bits to float32.
func FromFP16(src []uint16) []float32 {
	out := make([]float32, len(src))
	for i, h := range src {
		out[i] = FP16ToFloat32(h)
	}
	return out
}
