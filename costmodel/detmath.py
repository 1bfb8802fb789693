"""Elementary functions whose every bit is the same on every machine.

A run is a pure function of (trace, config, seed) on ANY machine (docs/engine.md,
"Across machines"). IEEE 754 makes ``+ - * /`` and ``sqrt`` exactly rounded, so they give the
same bits everywhere; transcendental functions do not: numpy's vectorised ``np.exp`` and
``np.log`` take an AVX-512 code path where the CPU has one and give results up to an ulp away
from the scalar path (measured: 4.6% of ``np.exp`` values over a million normal draws), the C
library's ``exp``/``log`` are not correctly rounded and differ between its FMA and plain
builds and between x86-64 and aarch64, and ``scipy.special.ndtri`` calls that ``log``.

So every value that feeds a simulation (synthetic traces, policy scores, router draws) comes
from the functions here, written with ``+ - * /``, ``math.sqrt``, ``math.ldexp`` and bit
manipulation only. ``exp`` and ``log`` are ports of fdlibm's ``e_exp.c`` and ``e_log.c``
(error below 1 ulp); ``ndtri`` is Cephes' ``ndtri.c`` (the algorithm ``scipy.special.ndtri``
runs) over that ``log``. They are scalar: callers use them per session or per request, never
per token. This module imports nothing of kvsim's, so every package may use it.
"""

from __future__ import annotations

import math
import struct

__all__ = ["NORMAL_BITS", "exp", "exp2", "log", "ndtri", "normal_from_bits", "powi"]

_INF = math.inf

# fdlibm e_exp.c
_O_THRESHOLD = 7.09782712893383973096e+02
_U_THRESHOLD = -7.45133219101941108420e+02
_LN2_HI = 6.93147180369123816490e-01  # low 21 bits of its significand are zero
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
_TINY_EXP = 2.0 ** -28

# fdlibm e_log.c
_TWO54 = 1.80143985094819840000e+16
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01

_pack = struct.Struct("<d")
_unpack_bits = struct.Struct("<Q")


def _bits(x: float) -> int:
    return _unpack_bits.unpack(_pack.pack(x))[0]


def _float(bits: int) -> float:
    return _pack.unpack(_unpack_bits.pack(bits))[0]


def exp(x: float) -> float:
    """e**x (fdlibm ``__ieee754_exp``); raises OverflowError where ``math.exp`` does."""
    x = float(x)
    if x != x:
        return x
    if x > _O_THRESHOLD:
        raise OverflowError("math range error")
    if x < _U_THRESHOLD:
        return 0.0
    if -_TINY_EXP < x < _TINY_EXP:
        return 1.0 + x
    # argument reduction: x = k ln2 + r, |r| <= ln2 / 2; k * _LN2_HI is exact for |k| < 2^21
    k = int(_INV_LN2 * x + (0.5 if x >= 0.0 else -0.5))
    hi = x - k * _LN2_HI
    lo = k * _LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    if k == 0:
        return 1.0 - ((r * c) / (c - 2.0) - r)
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    return math.ldexp(y, k)  # exact scaling by 2**k (one rounding where it turns subnormal)


def exp2(x: float) -> float:
    """2**x: the integer part exactly (``ldexp``), the fraction through ``exp``."""
    x = float(x)
    if x != x:
        return x
    if x > 1024.0:
        raise OverflowError("math range error")
    if x < -1100.0:
        return 0.0
    n = math.floor(x)
    return math.ldexp(exp((x - n) * _LN2_HI + (x - n) * _LN2_LO), n)


def powi(x: float, n: int) -> float:
    """``x ** n`` for an integer ``n >= 0`` by repeated squaring: multiplications only, each
    exactly rounded, where ``float ** int`` calls the C library's ``pow``."""
    if n < 0:
        raise ValueError("powi: negative exponent")
    out, base = 1.0, float(x)
    while n:
        if n & 1:
            out *= base
        base *= base
        n >>= 1
    return out


def log(x: float) -> float:
    """The natural logarithm (fdlibm ``__ieee754_log``); ValueError for x <= 0 as ``math.log``."""
    x = float(x)
    if x != x or x == _INF:
        return x
    if x <= 0.0:
        raise ValueError("math domain error")
    bits = _bits(x)
    hx, lx = bits >> 32, bits & 0xFFFFFFFF
    k = 0
    if hx < 0x00100000:  # subnormal: scale up
        k -= 54
        x *= _TWO54
        bits = _bits(x)
        hx, lx = bits >> 32, bits & 0xFFFFFFFF
    k += (hx >> 20) - 1023
    hx &= 0x000FFFFF
    i = (hx + 0x95F64) & 0x100000
    x = _float(((hx | (i ^ 0x3FF00000)) << 32) | lx)  # x or x/2, normalised to [sqrt(2)/2, sqrt(2))
    k += i >> 20
    f = x - 1.0
    dk = float(k)
    if (0x000FFFFF & (2 + hx)) < 3:  # |f| < 2**-20
        if f == 0.0:
            return 0.0 if k == 0 else dk * _LN2_HI + dk * _LN2_LO
        r = f * f * (0.5 - 0.33333333333333333 * f)
        return f - r if k == 0 else dk * _LN2_HI - ((r - dk * _LN2_LO) - f)
    s = f / (2.0 + f)
    z = s * s
    i = hx - 0x6147A
    w = z * z
    j = 0x6B851 - hx
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    i |= j
    r = t2 + t1
    if i > 0:
        hfsq = 0.5 * f * f
        if k == 0:
            return f - (hfsq - s * (hfsq + r))
        return dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)
    if k == 0:
        return f - s * (f - r)
    return dk * _LN2_HI - ((s * (f - r) - dk * _LN2_LO) - f)


# Cephes ndtri.c
_S2PI = 2.50662827463100050242e0
_EXP_M2 = 0.13533528323661269189
_NP0 = (-5.99633501014107895267e1, 9.80010754185999661536e1, -5.66762857469070293439e1,
        1.39312609387279679503e1, -1.23916583867381258016e0)
_NQ0 = (1.95448858338141759834e0, 4.67627912898881538453e0, 8.63602421390890590575e1,
        -2.25462687854119370527e2, 2.00260212380060660359e2, -8.20372256168333339912e1,
        1.59056225126211695515e1, -1.18331621121330003142e0)
_NP1 = (4.05544892305962419923e0, 3.15251094599893866154e1, 5.71628192246421288162e1,
        4.40805073893200834700e1, 1.46849561928858024014e1, 2.18663306850790267539e0,
        -1.40256079171354495875e-1, -3.50424626827848203418e-2, -8.57456785154685413611e-4)
_NQ1 = (1.57799883256466749731e1, 4.53907635128879210584e1, 4.13172038254672030440e1,
        1.50425385692907503408e1, 2.50464946208309415979e0, -1.42182922854787788574e-1,
        -3.80806407691578277194e-2, -9.33259480895457427372e-4)
_NP2 = (3.23774891776946035970e0, 6.91522889068984211695e0, 3.93881025292474443415e0,
        1.33303460815807542389e0, 2.01485389549179081538e-1, 1.23716634817820021358e-2,
        3.01581553508235416007e-4, 2.65806974686737550832e-6, 6.23974539184983293730e-9)
_NQ2 = (6.02427039364742014255e0, 3.67983563856160859403e0, 1.37702099489081330271e0,
        2.16236993594496635890e-1, 1.34204006088543189037e-2, 3.28014464682127739104e-4,
        2.89247864745380683936e-6, 6.79019408009981274425e-9)


def _polevl(x: float, coef: tuple[float, ...]) -> float:
    ans = coef[0]
    for c in coef[1:]:
        ans = ans * x + c
    return ans


def _p1evl(x: float, coef: tuple[float, ...]) -> float:  # leading coefficient 1
    ans = x + coef[0]
    for c in coef[1:]:
        ans = ans * x + c
    return ans


def ndtri(y: float) -> float:
    """The standard normal quantile: x with P(Z <= x) = y (Cephes ``ndtri``)."""
    y = float(y)
    if y == 0.0:
        return -_INF
    if y == 1.0:
        return _INF
    if not 0.0 < y < 1.0:
        return math.nan
    negate = True
    if y > 1.0 - _EXP_M2:
        y = 1.0 - y
        negate = False
    if y > _EXP_M2:
        y -= 0.5
        y2 = y * y
        x = y + y * (y2 * _polevl(y2, _NP0) / _p1evl(y2, _NQ0))
        return x * _S2PI
    x = math.sqrt(-2.0 * log(y))
    x0 = x - log(x) / x
    z = 1.0 / x
    if x < 8.0:
        x1 = z * _polevl(z, _NP1) / _p1evl(z, _NQ1)
    else:
        x1 = z * _polevl(z, _NP2) / _p1evl(z, _NQ2)
    x = x0 - x1
    return -x if negate else x


NORMAL_BITS = 52  # bits of one uniform draw behind a normal draw


def normal_from_bits(k: int) -> float:
    """A standard normal draw from ``k``, uniform in [0, 2**52): the quantile at the middle of
    the k-th of 2**52 equal strata, so never infinite (``(k + 0.5) * 2**-52`` is exact)."""
    return ndtri((k + 0.5) * 2.0 ** -NORMAL_BITS)
