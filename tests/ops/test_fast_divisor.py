"""csrc/common/fast_divisor.h, compiled with the host compiler: the multiply-high division the attention kernels use
for GQA groups and cache block sizes against C++'s own `/` and `%`. The kernels run the same functions (`__umulhi` in
place of the 64-bit product); the GPU attention tests cover them there (groups 1-8, block sizes 16, 32 and 528)."""

from __future__ import annotations

from tests.host_program import requires_host_compiler, run_host_program

pytestmark = requires_host_compiler

MAX_DIVISOR = 2100  # GQA groups, and block sizes up to the hybrid models' (vLLM pads those to e.g. 528 or 1056)
DENSE_NUMERATORS = 1 << 16  # every numerator below this: all row and key indices of realistic batches

BODY = f"""
  using namespace volta_fp4;
  long long checked = 0, wrong = 0;
  auto check = [&](uint32_t d, const FastDivisor& f, int n) {{
    int remainder = -1;
    const int quotient = fast_divmod(f, n, remainder);
    if (quotient != int(uint32_t(n) / d) || remainder != int(uint32_t(n) % d) || fast_quotient(f, n) != quotient) {{
      if (wrong < 5) std::printf("wrong: %d / %u -> %d rem %d\\n", n, d, quotient, remainder);
      ++wrong;
    }}
    ++checked;
  }};
  for (uint32_t d = 1; d <= {MAX_DIVISOR}; ++d) {{
    const FastDivisor f = make_fast_divisor(d);
    for (int n = 0; n < {DENSE_NUMERATORS}; ++n) check(d, f, n);
    // the top of the range and around multiples of d, where a rounding error would show first
    for (int k = 0; k < 64; ++k) check(d, f, 0x7fffffff - k);
    for (long long m = d; m < 0x7fffffffLL; m = m * 3 + 7) {{
      const long long q = m / d * d;
      for (long long n = q - 1; n <= q + 1; ++n)
        if (n >= 0 && n <= 0x7fffffffLL) check(d, f, int(n));
    }}
  }}
  std::printf("%lld %lld\\n", checked, wrong);
"""


def test_fast_divisor_matches_integer_division(tmp_path):
    output = run_host_program(tmp_path, ["common/fast_divisor.h"], BODY.splitlines())
    *wrong_lines, counts = output.strip().splitlines()
    checked, wrong = (int(x) for x in counts.split())
    assert wrong == 0, wrong_lines
    assert checked > MAX_DIVISOR * DENSE_NUMERATORS  # every divisor saw every dense numerator
