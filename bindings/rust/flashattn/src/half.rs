//! fp16 (IEEE binary16) and bfloat16 <-> f32 conversions on bit patterns,
//! rounding to nearest even, for filling and reading device tensors.

/// f32 -> binary16 bits, round to nearest even; overflow gives +-inf, NaN
/// stays NaN (quiet), tiny values become subnormals or zero.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        // inf or NaN (keep a quiet NaN payload bit).
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15; // rebias
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal half (or zero): shift the full significand right.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000; // implicit bit
        let shift = (14 - e) as u32; // 24-bit significand -> 10-bit at 2^-24
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && (h & 1) == 1) {
            h += 1; // may carry into the smallest normal: still correct
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1; // a carry into the exponent rounds up to the next binade / inf
    }
    sign | h as u16
}

/// binary16 bits -> f32 (exact).
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: value = man * 2^-24 (exact in f32).
            let v = man as f32 * f32::powi(2.0, -24);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// f32 -> bfloat16 bits, round to nearest even; NaN stays NaN.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// bfloat16 bits -> f32 (exact).
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Converts a slice of f32 to fp16 bits.
pub fn f32_slice_to_f16(xs: &[f32]) -> Vec<u16> {
    xs.iter().map(|&x| f32_to_f16_bits(x)).collect()
}

/// Converts a slice of fp16 bits to f32.
pub fn f16_slice_to_f32(hs: &[u16]) -> Vec<f32> {
    hs.iter().map(|&h| f16_bits_to_f32(h)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(-2.0), 0xc000);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00); // rounds to inf
        assert_eq!(f32_to_f16_bits(f32::INFINITY), 0x7c00);
        assert!(f16_bits_to_f32(f32_to_f16_bits(f32::NAN)).is_nan());
        assert_eq!(f32_to_f16_bits(5.960_464_5e-8), 0x0001); // smallest subnormal
        assert_eq!(f32_to_f16_bits(2.0e-8), 0x0000);
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
        assert_eq!(f16_bits_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_bits_to_f32(0x8001), -5.960_464_5e-8);
        assert_eq!(f16_bits_to_f32(0x3555), 0.333_251_95);
        // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
        assert_eq!(f32_to_f16_bits(1.0 + f32::powi(2.0, -11)), 0x3c00);
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits_to_f32(0x4049), 3.140_625);
    }

    #[test]
    fn every_half_round_trips() {
        for h in 0..=u16::MAX {
            let f = f16_bits_to_f32(h);
            if f.is_nan() {
                assert!(f16_bits_to_f32(f32_to_f16_bits(f)).is_nan());
            } else {
                assert_eq!(f32_to_f16_bits(f), h, "bits {h:#06x} -> {f}");
            }
        }
    }

    #[test]
    fn rounding_is_nearest() {
        // For values between consecutive halves the nearer one is chosen.
        let mut x = -70000.0f32;
        while x < 70000.0 {
            let h = f32_to_f16_bits(x);
            let y = f16_bits_to_f32(h);
            if y.is_finite() {
                let next = f16_bits_to_f32(if (y >= 0.0) == (x >= y) {
                    h.wrapping_add(1)
                } else {
                    h.wrapping_sub(1)
                });
                if next.is_finite() {
                    assert!((x - y).abs() <= (x - next).abs(), "{x} -> {y}, {next} is nearer");
                }
            }
            x += 0.37;
        }
    }
}
