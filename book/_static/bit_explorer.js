/* The bit explorer of the Mixed Precision Training Lab, in plain JavaScript (no build step, no network).
 *
 * Any element <div class="mpt-bit-explorer" data-format="FP16" data-value="-314.625"></div> on a page that
 * loads this script becomes an explorer: click bits to toggle them, or type a value; choose the format from
 * the list.  It shows the bits coloured by field, the code, the kind, the formula, the stored value exactly
 * (as a decimal expansion), its neighbours and ulp, and the typed value rounded to nearest-even, toward zero
 * and with saturation, each with its exact rounding error.
 *
 * Typed input (spaces and underscores are ignored; "−" and "∞" are accepted):
 *   -314.625  1e-7  .5  1/3  -2.5e3/7    a decimal, or a fraction of two decimals
 *   0x1.8p3  -0x1p-24                    a hexadecimal float (C99 / Python float.hex): "0x" WITH a "p" exponent
 *   0x3C00  0b0011110000000000           a raw code: "0x" WITHOUT "p" (hex) or "0b" (binary); no sign
 *   inf  -inf  nan                       special values
 *
 * All arithmetic is exact (BigInt rationals): rounding follows mpt_lab.formats.round_to, overflow conventions
 * included (without saturation: infinity where the format has one, NaN where it has NaN but no infinity
 * (E4M3, E8M0), ±max where it has neither (FP6, FP4); toward zero carries finite overflow to ±max; with
 * saturation: ±max).  E8M0 is unsigned and has no zero: zeros and negative values become NaN, positive values
 * below 2^-127 become 2^-127, as in mpt_lab (and ml_dtypes).
 *
 * Paths.  Sphinx copies book/_static/ to _build/html/_static/ (_config.yml: html_static_path), and a page
 * reaches it relative to its own folder: _build/html/notebooks/01_floating_point.html loads
 * ../_static/bit_explorer.js, a page at the top (intro.html) loads _static/bit_explorer.js.  _config.yml also
 * lists this script in html_js_files, so Sphinx writes the right relative <script> into every page and a
 * bare <div class="mpt-bit-explorer"> works at any depth; a <script src="../_static/bit_explorer.js"> in a
 * notebook's markdown cell is then redundant but harmless: the script is idempotent (loaded twice, it mounts
 * each explorer once).  The CSS (bit_explorer.css) is found from the script's own URL (document.currentScript),
 * so it comes along whatever the page's depth, unless the page links it already.  A pure API for tests and
 * pages: window.MPTBitExplorer (see the end).
 *
 * The format table below is mpt_lab.formats.FORMATS, field by field (tests/test_bit_explorer_js.py checks it;
 * `python tests/test_bit_explorer_js.py` prints the table from Python).
 */
(function (root) {
  "use strict";

  if (root.MPTBitExplorer && root.MPTBitExplorer.version) {  // loaded twice: just mount any new explorers
    root.MPTBitExplorer.initAll();
    return;
  }

  // ---- the format catalogue (mpt_lab.formats.FORMATS) -------------------------------------------------
  // BEGIN FORMATS
  var FORMAT_TABLE = [
    {name: "FP64", exponentBits: 11, mantissaBits: 52, bias: 1023, signed: true, infinities: true, nan: "ieee", subnormals: true, source: "IEEE 754-2019 binary64"},
    {name: "FP32", exponentBits: 8, mantissaBits: 23, bias: 127, signed: true, infinities: true, nan: "ieee", subnormals: true, source: "IEEE 754-2019 binary32"},
    {name: "TF32", exponentBits: 8, mantissaBits: 10, bias: 127, signed: true, infinities: true, nan: "ieee", subnormals: true, source: "NVIDIA TensorFloat-32 (A100 whitepaper, 2020)"},
    {name: "FP16", exponentBits: 5, mantissaBits: 10, bias: 15, signed: true, infinities: true, nan: "ieee", subnormals: true, source: "IEEE 754-2019 binary16"},
    {name: "BF16", exponentBits: 8, mantissaBits: 7, bias: 127, signed: true, infinities: true, nan: "ieee", subnormals: true, source: "bfloat16 (Google Brain); Kalamkar et al. 2019"},
    {name: "FP8_E4M3", exponentBits: 4, mantissaBits: 3, bias: 7, signed: true, infinities: false, nan: "single", subnormals: true, source: "OCP OFP8 2023, E4M3 (E4M3FN)"},
    {name: "FP8_E5M2", exponentBits: 5, mantissaBits: 2, bias: 15, signed: true, infinities: true, nan: "ieee", subnormals: true, source: "OCP OFP8 2023, E5M2"},
    {name: "FP6_E3M2", exponentBits: 3, mantissaBits: 2, bias: 3, signed: true, infinities: false, nan: "none", subnormals: true, source: "OCP MX v1.0, FP6 E3M2"},
    {name: "FP6_E2M3", exponentBits: 2, mantissaBits: 3, bias: 1, signed: true, infinities: false, nan: "none", subnormals: true, source: "OCP MX v1.0, FP6 E2M3"},
    {name: "FP4_E2M1", exponentBits: 2, mantissaBits: 1, bias: 1, signed: true, infinities: false, nan: "none", subnormals: true, source: "OCP MX v1.0, FP4 E2M1"},
    {name: "E8M0", exponentBits: 8, mantissaBits: 0, bias: 127, signed: false, infinities: false, nan: "single", subnormals: false, source: "OCP MX v1.0, E8M0 shared scale"}
  ];
  // END FORMATS

  var ZERO = BigInt(0), ONE = BigInt(1), TWO = BigInt(2), FIVE = BigInt(5), TEN = BigInt(10);
  var MODES = ["nearest_even", "toward_zero"];
  var MAX_DECIMAL_EXPONENT = 5000;   // |e| of a typed 1e±N; beyond it the input is refused
  var FIELD_NAMES = ["sign", "exponent", "mantissa"];

  function big(n) { return BigInt(n); }
  function pow2(k) { return ONE << big(k); }
  function bitLength(n) { return n === ZERO ? 0 : n.toString(2).length; }   // n >= 0
  function gcd(a, b) { while (b !== ZERO) { var t = a % b; a = b; b = t; } return a; }

  function derive(f) {
    var top = (1 << f.exponentBits) - 1;
    var m = f.mantissaBits;
    var maxE = (f.nan === "ieee" || (f.nan === "single" && m === 0)) ? top - 1 : top;
    var maxM = Number(pow2(m) - ONE) - ((f.nan === "single" && m > 0) ? 1 : 0);
    f.bits = (f.signed ? 1 : 0) + f.exponentBits + m;
    f.hexDigits = Math.ceil(f.bits / 4);
    f.topExponentField = top;
    f.maxExponentField = maxE;
    f.maxMantissaField = maxM;
    f.emax = maxE - f.bias;
    f.emin = f.subnormals ? 1 - f.bias : -f.bias;
    f.signMask = f.signed ? pow2(f.bits - 1) : ZERO;
    f.maxCode = (big(maxE) << big(m)) | big(maxM);
    f.maxSignificand = pow2(m) + big(maxM);            // max = maxSignificand * 2^(emax - m)
    return f;
  }

  var FORMATS = {}, ORDER = [];
  FORMAT_TABLE.forEach(function (f) { FORMATS[f.name] = derive(f); ORDER.push(f.name); });
  var ALIASES = {FLOAT64: "FP64", DOUBLE: "FP64", FLOAT32: "FP32", FLOAT: "FP32", FLOAT16: "FP16", HALF: "FP16",
                 BFLOAT16: "BF16", E4M3: "FP8_E4M3", E4M3FN: "FP8_E4M3", FP8_E4M3FN: "FP8_E4M3", E5M2: "FP8_E5M2",
                 E3M2: "FP6_E3M2", E2M3: "FP6_E2M3", E2M1: "FP4_E2M1", FP4: "FP4_E2M1", FP8_E8M0: "E8M0"};

  function getFormat(name) {
    if (name && typeof name === "object" && name.bits) return name;
    var key = String(name).trim().toUpperCase().replace(/-/g, "_");
    key = ALIASES[key] || key;
    if (!FORMATS[key]) throw new Error("unknown format " + JSON.stringify(name) + "; expected one of " + ORDER.join(", "));
    return FORMATS[key];
  }

  // ---- exact numbers: {s: 0|1, n: BigInt >= 0, d: BigInt > 0} or {s, special: "inf"|"nan"} ---------------
  function rational(s, n, d) {
    if (d === ZERO) throw new Error("division by zero");
    if (d < ZERO) { d = -d; n = -n; }
    if (n < ZERO) { n = -n; s = 1 - s; }
    var g = gcd(n, d);
    if (g > ONE) { n /= g; d /= g; }
    if (n === ZERO) d = ONE;
    return {s: s, n: n, d: d};
  }

  function dyadic(s, n, exp2) {   // (-1)^s * n * 2^exp2
    return exp2 >= 0 ? rational(s, n << big(exp2), ONE) : rational(s, n, pow2(-exp2));
  }

  var DEC_RE = /^(\d*)(?:\.(\d*))?(?:e([+-]?\d+))?$/;

  function parseDecimal(t) {   // unsigned decimal → [n, d]
    var m = DEC_RE.exec(t);
    if (!m || (m[1] + (m[2] || "")).length === 0) return null;
    var digits = m[1] + (m[2] || "");
    var e = (m[3] ? parseInt(m[3], 10) : 0) - (m[2] || "").length;
    if (Math.abs(e) > MAX_DECIMAL_EXPONENT + digits.length) throw new Error("decimal exponent out of range (|e| ≤ " + MAX_DECIMAL_EXPONENT + ")");
    var n = big(digits);
    return e >= 0 ? [n * TEN ** big(e), ONE] : [n, TEN ** big(-e)];
  }

  function signOf(t) {   // → [sign, rest]
    if (t[0] === "-") return [1, t.slice(1)];
    if (t[0] === "+") return [0, t.slice(1)];
    return [0, t];
  }

  /** Parse typed text: {type: "code", code: BigInt} or {type: "value", value: rational or special}. */
  function parse(text) {
    var raw = String(text);
    var t = raw.replace(/[\s_]/g, "").replace(/\u2212/g, "-").replace(/\u221e/g, "inf").toLowerCase();
    if (!t) throw new Error("empty input: type a value (-314.625, 1e-7, 1/3, 0x1.8p3) or a code (0x3C00, 0b0011…)");
    if (/^0x[0-9a-f]+$/.test(t)) return {type: "code", code: big(t)};
    if (/^0b[01]+$/.test(t)) return {type: "code", code: big(t)};
    var sr = signOf(t), s = sr[0], r = sr[1];
    if (r === "inf" || r === "infinity") return {type: "value", value: {s: s, special: "inf"}};
    if (r === "nan") return {type: "value", value: {s: s, special: "nan"}};
    var hx = /^0x([0-9a-f]*)(?:\.([0-9a-f]*))?p([+-]?\d+)$/.exec(r);
    if (hx) {
      var hd = hx[1] + (hx[2] || "");
      if (!hd) throw new Error("not a hexadecimal float: " + raw);
      var p = parseInt(hx[3], 10);
      if (Math.abs(p) > 20000) throw new Error("binary exponent out of range (|p| ≤ 20000)");
      return {type: "value", value: dyadic(s, big("0x" + hd), p - 4 * (hx[2] || "").length)};
    }
    if (r.indexOf("/") >= 0) {
      var parts = r.split("/");
      if (parts.length !== 2) throw new Error("a fraction has one '/': " + raw);
      var d0 = signOf(parts[1]);
      var a = parseDecimal(parts[0]), b = parseDecimal(d0[1]);
      if (!a || !b) throw new Error("not a fraction of two decimals: " + raw);
      if (b[0] === ZERO) throw new Error("division by zero: " + raw);
      return {type: "value", value: rational((s + d0[0]) % 2, a[0] * b[1], a[1] * b[0])};
    }
    var dv = parseDecimal(r);
    if (!dv) throw new Error("not a number: " + JSON.stringify(raw) +
      " (try -314.625, 1e-7, 1/3, 0x1.8p3, inf, nan, or a code such as 0x3C00)");
    return {type: "value", value: rational(s, dv[0], dv[1])};
  }

  function parseValue(text) {
    if (text && typeof text === "object") return text;
    var p = parse(text);
    if (p.type !== "value") throw new Error("expected a value, got a code: " + text + " (a hex float needs a 'p' exponent, e.g. 0x1.8p3)");
    return p.value;
  }

  function parseCode(f, code) {
    var c;
    if (typeof code === "bigint") c = code;
    else if (typeof code === "number") c = big(code);
    else {
      var t = String(code).replace(/[\s_]/g, "").toLowerCase();
      if (!/^(0x[0-9a-f]+|0b[01]+|\d+)$/.test(t)) throw new Error("not a code: " + JSON.stringify(code));
      c = big(t);
    }
    if (c < ZERO || c >= pow2(f.bits)) throw new Error("code " + code + " out of range for " + f.name + " (" + f.bits + " bits)");
    return c;
  }

  // ---- formatting exact numbers -----------------------------------------------------------------------
  function decimalDigits(q) {   // q with d = 2^a 5^b: the exact decimal expansion, else null
    var d = q.d, a = 0, b = 0;
    if ((d & (d - ONE)) === ZERO) { a = bitLength(d) - 1; d = ONE; }   // a power of two: every stored value
    while (d % TWO === ZERO) { d /= TWO; a++; }
    while (d % FIVE === ZERO) { d /= FIVE; b++; }
    if (d !== ONE) return null;
    var k = Math.max(a, b);
    var digits = (q.n * TWO ** big(k - a) * FIVE ** big(k - b)).toString();
    var out;
    if (k === 0) out = digits;
    else {
      if (digits.length <= k) digits = "0".repeat(k - digits.length + 1) + digits;
      out = digits.slice(0, digits.length - k) + "." + digits.slice(digits.length - k);
      out = out.replace(/0+$/, "").replace(/\.$/, "");
    }
    return (q.s ? "-" : "") + out;
  }

  /** The exact value as text: a decimal expansion when finite, else "n/d"; "inf", "-inf", "nan". */
  function exactString(q) {
    if (q.special) return q.special === "inf" ? (q.s ? "-inf" : "inf") : (q.s ? "-nan" : "nan");
    var dec = decimalDigits(q);
    return dec !== null ? dec : (q.s ? "-" : "") + q.n.toString() + "/" + q.d.toString();
  }

  /** ≈ value with `digits` significant digits (truncated), in scientific notation when far from 1. */
  function approxString(q, digits) {
    if (q.special) return exactString(q);
    if (q.n === ZERO) return q.s ? "-0" : "0";
    digits = digits || 6;
    var e = q.n.toString().length - q.d.toString().length;
    var sh = digits - e;
    var Q = sh >= 0 ? q.n * TEN ** big(sh) / q.d : q.n / (q.d * TEN ** big(-sh));
    var qs = Q.toString();
    var exp10 = qs.length - 1 - sh;
    var mant = qs[0] + (digits > 1 ? "." + qs.slice(1, digits) : "");
    mant = mant.replace(/\.?0+$/, "");
    var sign = q.s ? "-" : "";
    if (exp10 >= -4 && exp10 < digits) {
      var num = (qs + "0".repeat(Math.max(0, exp10 + 1 - qs.length))).slice(0, Math.max(exp10 + 1, 0));
      var frac = exp10 >= 0 ? qs.slice(exp10 + 1, digits) : "0".repeat(-exp10 - 1) + qs.slice(0, digits);
      frac = frac.replace(/0+$/, "");
      return sign + (num || "0") + (frac ? "." + frac : "");
    }
    return sign + mant + "e" + (exp10 < 0 ? "-" : "+") + Math.abs(exp10);
  }

  /** Exact hexadecimal float of a dyadic value (0x1.8p+3), as Python's float.hex but with minimal digits. */
  function hexFloatString(q) {
    if (q.special) return exactString(q);
    var sign = q.s ? "-" : "";
    if (q.n === ZERO) return sign + "0x0p+0";
    var n = q.n, k = bitLength(q.d) - 1;          // q = n / 2^k (d is a power of two)
    var L = bitLength(n) - 1, e = L - k;
    var hexLen = Math.ceil(L / 4);
    var frac = (n - pow2(L)) << big(4 * hexLen - L);
    var fs = hexLen ? frac.toString(16).padStart(hexLen, "0").replace(/0+$/, "") : "";
    return sign + "0x1" + (fs ? "." + fs : "") + "p" + (e < 0 ? "-" : "+") + Math.abs(e);
  }

  function hexCode(f, c) { return "0x" + c.toString(16).toUpperCase().padStart(f.hexDigits, "0"); }

  function binaryFields(f, c) {
    var s = c.toString(2).padStart(f.bits, "0"), i = f.signed ? 1 : 0;
    return {sign: f.signed ? s[0] : "", exponent: s.slice(i, i + f.exponentBits), mantissa: s.slice(i + f.exponentBits)};
  }

  // ---- decode -------------------------------------------------------------------------------------------
  function decodeBig(f, c) {
    var m = big(f.mantissaBits);
    var sign = f.signed ? Number((c >> big(f.exponentBits + f.mantissaBits)) & ONE) : 0;
    var ef = Number((c >> m) & (pow2(f.exponentBits) - ONE));
    var mf = c & (pow2(f.mantissaBits) - ONE);
    var allOnesM = pow2(f.mantissaBits) - ONE;
    var kind, value, ue;
    if (f.subnormals && ef === 0) {
      kind = mf === ZERO ? "zero" : "subnormal";
      ue = f.emin;
    } else {
      kind = "normal";
      ue = ef - f.bias;
    }
    if (f.nan === "ieee" && ef === f.topExponentField) kind = mf === ZERO ? "infinity" : "nan";
    else if (f.nan === "single" && ef === f.topExponentField && mf === allOnesM) kind = "nan";
    if (kind === "infinity") value = {s: sign, special: "inf"};
    else if (kind === "nan") value = {s: sign, special: "nan"};
    else if (kind === "normal") value = dyadic(sign, pow2(f.mantissaBits) + mf, ue - f.mantissaBits);
    else value = dyadic(sign, mf, f.emin - f.mantissaBits);
    return {format: f.name, codeBig: c, code: hexCode(f, c), kind: kind, sign: sign, exponentField: ef,
            mantissaField: Number(mf), unbiasedExponent: ue, value: value};
  }

  // ---- rounding (mpt_lab.formats.round_to / encode) -----------------------------------------------------
  function nanCode(f, s) {
    var c = big(f.topExponentField) << big(f.mantissaBits);
    c |= f.nan === "ieee" ? pow2(f.mantissaBits - 1) : pow2(f.mantissaBits) - ONE;
    return s && f.signed ? c | f.signMask : c;
  }
  function infCode(f, s) { return (big(f.topExponentField) << big(f.mantissaBits)) | (s ? f.signMask : ZERO); }
  function maxCode(f, s) { return f.maxCode | (s ? f.signMask : ZERO); }

  function floorLog2(n, d) {   // e with 2^e <= n/d < 2^(e+1), n, d > 0
    var e = bitLength(n) - bitLength(d);
    if (e >= 0 ? n < (d << big(e)) : (n << big(-e)) < d) e -= 1;
    return e;
  }

  /** The code of value x (rational or special) rounded to f; throws for NaN in a format without NaN. */
  function roundBig(f, x, mode, saturate) {
    mode = mode || "nearest_even";
    if (MODES.indexOf(mode) < 0) throw new Error("rounding must be one of " + MODES.join(", ") + " (stochastic rounding is random; see mpt_lab.formats.round_to), got " + mode);
    var s = x.s;
    if (x.special === "nan") {
      if (f.nan === "none") throw new Error("NaN cannot be encoded in " + f.name + " (it has no NaN)");
      return nanCode(f, s);
    }
    if (!f.signed && (s === 1 || (!x.special && x.n === ZERO))) return nanCode(f, 0);  // E8M0: negative, zero
    var sbit = s ? f.signMask : ZERO;
    if (x.special === "inf") {
      if (saturate) return maxCode(f, s);
      if (f.infinities) return infCode(f, s);
      return f.nan !== "none" ? nanCode(f, s) : maxCode(f, s);
    }
    if (x.n === ZERO) return sbit;
    var m = f.mantissaBits;
    var e = Math.max(floorLog2(x.n, x.d), f.emin);
    var shift = m - e, N = x.n, D = x.d;           // x / 2^(e - m) = N / D
    if (shift >= 0) N <<= big(shift); else D <<= big(-shift);
    var k = N / D, r = N - k * D;
    if (mode === "nearest_even" && (TWO * r > D || (TWO * r === D && (k & ONE) === ONE))) k += ONE;
    var lead = pow2(m);
    if (!f.subnormals && k < lead) k = lead;        // E8M0: no zero, positive values below 2^emin become 2^emin
    if (k === pow2(m + 1)) { k = lead; e += 1; }   // rounded up into the next binade
    if (e > f.emax || (e === f.emax && k > f.maxSignificand)) {   // overflow
      if (saturate || mode === "toward_zero") return maxCode(f, s);  // IEEE 754 §7.4: toward zero → ±max
      if (f.infinities) return infCode(f, s);
      return f.nan !== "none" ? nanCode(f, s) : maxCode(f, s);
    }
    if (k < lead) return sbit | k;                   // zero or subnormal (e == emin)
    return sbit | (big(e + f.bias) << big(m)) | (k - lead);
  }

  function sub(a, b) { return rational(0, (a.s ? -a.n : a.n) * b.d - (b.s ? -b.n : b.n) * a.d, a.d * b.d); }
  function absq(a) { return a.special ? {s: 0, special: a.special} : {s: 0, n: a.n, d: a.d}; }
  function divq(a, b) { return rational((a.s + b.s) % 2, a.n * b.d, a.d * b.n); }

  function ulpBig(f, x) {
    if (x.special) return x.special === "inf" ? {s: 0, special: "inf"} : {s: 0, special: "nan"};
    var e = x.n === ZERO ? f.emin : Math.min(Math.max(floorLog2(x.n, x.d), f.emin), f.emax);
    return dyadic(0, ONE, e - f.mantissaBits);
  }

  function neighboursBig(f, c) {
    var d = decodeBig(f, c);
    if (d.kind === "nan" || d.kind === "infinity") return {down: null, up: null};
    function finite(code) {
      if (code < ZERO || code >= pow2(f.bits)) return null;
      var k = decodeBig(f, code).kind;
      return k === "nan" || k === "infinity" ? null : code;
    }
    if (!f.signed) return {down: finite(c - ONE), up: finite(c + ONE)};
    var mag = c & (f.signMask - ONE), sm = c & f.signMask;
    if (mag === ZERO) return {down: f.signMask | ONE, up: ONE};    // ±0: the smallest subnormals
    var larger = mag + ONE < f.signMask ? finite(sm | (mag + ONE)) : null;
    var smaller = sm | (mag - ONE);
    return d.sign ? {down: larger, up: smaller} : {down: smaller, up: larger};
  }

  // ---- the public API (plain values, for tests and pages) -----------------------------------------------
  function publicDecode(fmtName, code) {
    var f = getFormat(fmtName), d = decodeBig(f, parseCode(f, code));
    var b = binaryFields(f, d.codeBig);
    return {format: f.name, code: d.code, kind: d.kind, sign: d.sign, exponentField: d.exponentField,
            mantissaField: d.mantissaField, unbiasedExponent: d.unbiasedExponent, exact: exactString(d.value),
            bits: [b.sign, b.exponent, b.mantissa].filter(function (x) { return x !== ""; }).join(" "),
            formula: formulaParts(f, d).text};
  }

  function publicRound(fmtName, valueText, mode, saturate) {
    var f = getFormat(fmtName);
    return hexCode(f, roundBig(f, parseValue(valueText), mode, !!saturate));
  }

  function roundDetail(f, x, mode, saturate) {
    var c = roundBig(f, x, mode, saturate), d = decodeBig(f, c), err = null, rel = null;
    if (!x.special && !d.value.special) {
      err = sub(d.value, x);
      if (x.n !== ZERO) rel = divq(absq(err), absq(x));
    }
    return {code: c, decoded: d, error: err, relative: rel};
  }

  function publicNeighbours(fmtName, code) {
    var f = getFormat(fmtName), nb = neighboursBig(f, parseCode(f, code));
    function one(c) { return c === null ? null : {code: hexCode(f, c), exact: exactString(decodeBig(f, c).value)}; }
    return {down: one(nb.down), up: one(nb.up)};
  }

  function publicFormats() {
    var out = {};
    ORDER.forEach(function (name) {
      var f = FORMATS[name];
      out[name] = {name: name, bits: f.bits, exponentBits: f.exponentBits, mantissaBits: f.mantissaBits,
                   bias: f.bias, signed: f.signed, infinities: f.infinities, nan: f.nan, subnormals: f.subnormals,
                   emin: f.emin, emax: f.emax, source: f.source,
                   max: exactString(decodeBig(f, f.maxCode).value), maxCode: hexCode(f, f.maxCode)};
    });
    return out;
  }

  // ---- the formula ---------------------------------------------------------------------------------------
  function formulaParts(f, d) {   // → {html, text}
    var b = binaryFields(f, d.codeBig);
    var sgn = d.sign ? "\u2212" : "+";
    var sgnHtml = f.signed ? "(\u22121)<sup>" + d.sign + "</sup> \u00d7 " : "";
    var sgnText = f.signed ? "(\u22121)^" + d.sign + " \u00d7 " : "";
    if (d.kind === "infinity") {
      var t = "exponent field all ones, mantissa 0: " + sgn + "\u221e";
      return {html: t, text: t};
    }
    if (d.kind === "nan") {
      var tn = f.nan === "ieee" ? "exponent field all ones, mantissa \u2260 0: NaN"
        : "exponent and mantissa fields all ones: NaN (the format's only NaN" + (f.signed ? " per sign" : "") + ")";
      return {html: tn, text: tn};
    }
    var lead = d.kind === "normal" ? "1" : "0";
    var sig = lead + (f.mantissaBits ? "." + b.mantissa : "") + "\u2082";
    if (d.kind === "normal") {
      var e = d.unbiasedExponent;
      var h = sgnHtml + sig + " \u00d7 2<sup>" + d.exponentField + " \u2212 " + f.bias + "</sup> = " +
        (d.sign ? "\u2212" : "") + sig + " \u00d7 2<sup>" + e + "</sup>";
      var tx = sgnText + sig + " \u00d7 2^(" + d.exponentField + " \u2212 " + f.bias + ") = " +
        (d.sign ? "\u2212" : "") + sig + " \u00d7 2^" + e;
      return {html: h, text: tx};
    }
    var note = " (" + (d.kind === "zero" ? "zero" : "subnormal") + ": exponent = emin = 1 \u2212 bias = " + f.emin + ")";
    return {html: sgnHtml + sig + " \u00d7 2<sup>" + f.emin + "</sup>" + note,
            text: sgnText + sig + " \u00d7 2^" + f.emin + note};
  }

  // ---- the explorer (DOM) --------------------------------------------------------------------------------
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function valueText(q) {   // a short exact text for the input box
    var dec = exactString(q);
    if (q.special || dec.length <= 40) return dec;
    return hexFloatString(q);
  }

  function exactHtml(q) {
    var s = exactString(q);
    if (q.special) return escapeHtml(s === "inf" ? "+\u221e" : s === "-inf" ? "\u2212\u221e" : "NaN");
    var code = '<code class="mpt-be-exact">' + escapeHtml(s) + "</code>";
    var approx = '<span class="mpt-be-approx">\u2248 ' + escapeHtml(approxString(q, 9)) + "</span>";
    if (s.length > 60) {   // e.g. FP64's subnormals: hundreds of digits, one click away
      var digits = s.replace(/^-?[0.]*/, "").replace(/[^0-9]/g, "").length;
      return '<details class="mpt-be-long"><summary>' + approx + " (exactly: " + digits + " significant digits)</summary>" + code + "</details>";
    }
    return s.length > 24 || s.indexOf("/") >= 0 ? code + " " + approx : code;
  }

  function escapeHtml(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  function Explorer(host) {
    this.host = host;
    var fmtName = host.getAttribute("data-format") || "FP16";
    var allowed = (host.getAttribute("data-formats") || "").split(/[\s,]+/).filter(Boolean).map(function (n) { return getFormat(n).name; });
    this.formats = allowed.length ? allowed : ORDER.slice();
    this.fmt = getFormat(fmtName);
    if (this.formats.indexOf(this.fmt.name) < 0) this.formats.unshift(this.fmt.name);
    this.build();
    var initial = host.getAttribute("data-value");
    this.setText(initial === null ? "-314.625" : initial);
  }

  Explorer.prototype.build = function () {
    var self = this, host = this.host;
    host.textContent = "";
    host.classList.add("mpt-be-mounted");
    var controls = el("div", {"class": "mpt-be-controls"});
    var fl = el("label", {"class": "mpt-be-format-label"}, "format ");
    this.select = el("select", {"class": "mpt-be-format", "aria-label": "format"});
    this.formats.forEach(function (n) {
      var f = FORMATS[n];
      var o = el("option", {value: n}, n + " (" + f.bits + " bits)");
      self.select.appendChild(o);
    });
    this.select.value = this.fmt.name;
    fl.appendChild(this.select);
    var vl = el("label", {"class": "mpt-be-value-label"}, "value or code ");
    this.input = el("input", {type: "text", "class": "mpt-be-value", spellcheck: "false", autocomplete: "off",
                              "aria-label": "value or code",
                              title: "a value: -314.625, 1e-7, 1/3, 0x1.8p3, inf, nan; a code: 0x3C00 (0x without p) or 0b…"});
    vl.appendChild(this.input);
    this.button = el("button", {type: "button", "class": "mpt-be-apply"}, "set");
    this.message = el("span", {"class": "mpt-be-message", role: "status", "aria-live": "polite"});
    controls.appendChild(fl); controls.appendChild(vl); controls.appendChild(this.button); controls.appendChild(this.message);
    this.bitsBox = el("div", {"class": "mpt-be-bits", role: "group", "aria-label": "bits; click to toggle"});
    this.info = el("table", {"class": "mpt-be-info"});
    this.rounding = el("table", {"class": "mpt-be-rounding"});
    host.appendChild(controls); host.appendChild(this.bitsBox); host.appendChild(this.info); host.appendChild(this.rounding);

    this.select.addEventListener("change", function () { self.setFormat(self.select.value); });
    this.input.addEventListener("keydown", function (ev) { if (ev.key === "Enter") { ev.preventDefault(); self.setText(self.input.value); } });
    this.input.addEventListener("change", function () { self.setText(self.input.value); });
    this.button.addEventListener("click", function () { self.setText(self.input.value); });
    this.bitsBox.addEventListener("click", function (ev) {
      var t = ev.target.closest ? ev.target.closest("button.mpt-be-bit") : null;
      if (t) self.toggle(parseInt(t.getAttribute("data-bit"), 10));
    });
    this.buildBits();
  };

  Explorer.prototype.buildBits = function () {
    var f = this.fmt, box = this.bitsBox, i = 0;
    box.textContent = "";
    box.setAttribute("data-format", f.name);
    var widths = {sign: f.signed ? 1 : 0, exponent: f.exponentBits, mantissa: f.mantissaBits};
    this.bitButtons = [];
    var self = this;
    FIELD_NAMES.forEach(function (field) {
      if (!widths[field]) return;
      var group = el("span", {"class": "mpt-be-field mpt-be-field-" + field});
      group.appendChild(el("span", {"class": "mpt-be-field-label"}, field));
      var row = el("span", {"class": "mpt-be-field-bits"});
      for (var j = 0; j < widths[field]; j++, i++) {
        var weight = field === "sign" ? "sign" : field + " bit, weight 2^" + (widths[field] - 1 - j);
        var b = el("button", {type: "button", "class": "mpt-be-bit mpt-be-" + field, "data-bit": String(i),
                              "data-field": field, title: "bit " + (f.bits - 1 - i) + ": " + weight + " (click to toggle)"}, "0");
        row.appendChild(b);
        self.bitButtons.push(b);
      }
      group.appendChild(row);
      box.appendChild(group);
    });
  };

  Explorer.prototype.setFormat = function (name) {
    this.fmt = getFormat(name);
    this.select.value = this.fmt.name;
    this.buildBits();
    if (!this.setText(this.input.value)) {   // e.g. NaN into FP4, which has none: the message stays, show 0
      this.typed = {s: 0, n: ZERO, d: ONE};
      this.code = roundBig(this.fmt, this.typed, "nearest_even", false);
      this.input.value = "0";
      this.render();
    }
  };

  /** Apply typed text: a value is rounded (nearest even) and stored; a code is stored as it is. */
  Explorer.prototype.setText = function (text) {
    var f = this.fmt, p;
    try {
      p = parse(text);
      if (p.type === "code") parseCode(f, p.code);
      else roundBig(f, p.value, "nearest_even", false);   // throws for NaN in FP6/FP4
    } catch (err) {
      this.showMessage(err.message, true);
      if (this.code === undefined) { this.code = ZERO; this.typed = {s: 0, n: ZERO, d: ONE}; this.input.value = "0"; this.render(); }
      return false;
    }
    if (p.type === "code") {
      this.setCode(p.code);
      this.showMessage("code " + hexCode(f, p.code) + " set", false);
    } else {
      this.typed = p.value;
      this.code = roundBig(f, p.value, "nearest_even", false);
      this.input.value = String(text).trim();
      this.showMessage("", false);
      this.render();
    }
    return true;
  };

  /** Store a code; the typed value becomes its exact value, so every part of the explorer agrees. */
  Explorer.prototype.setCode = function (code) {
    var f = this.fmt;
    this.code = parseCode(f, code);
    var d = decodeBig(f, this.code);
    this.typed = d.value;
    this.input.value = valueText(d.value);
    this.render();
  };

  Explorer.prototype.toggle = function (i) {
    var f = this.fmt;
    if (!(i >= 0 && i < f.bits)) throw new Error("bit index must lie in [0, " + f.bits + ")");
    this.setCode(this.code ^ pow2(f.bits - 1 - i));
    this.showMessage("", false);
  };

  Explorer.prototype.showMessage = function (text, isError) {
    this.message.textContent = text;
    this.message.classList.toggle("mpt-be-error", !!isError);
  };

  Explorer.prototype.state = function () {   // for tests: what the explorer shows
    var d = publicDecode(this.fmt.name, this.code);
    d.typed = exactString(this.typed);
    d.input = this.input.value;
    return d;
  };

  Explorer.prototype.render = function () {
    var f = this.fmt, c = this.code, d = decodeBig(f, c);
    var s = c.toString(2).padStart(f.bits, "0");
    this.bitButtons.forEach(function (b, i) {
      b.textContent = s[i];
      b.setAttribute("aria-pressed", s[i] === "1" ? "true" : "false");
      b.classList.toggle("mpt-be-one", s[i] === "1");
    });
    var b = binaryFields(f, c);
    var fields = [];
    if (f.signed) fields.push('<span class="mpt-be-sign">sign ' + b.sign + "</span>");
    fields.push('<span class="mpt-be-exponent">exponent ' + b.exponent + "\u2082 = " + d.exponentField + "</span>");
    if (f.mantissaBits) fields.push('<span class="mpt-be-mantissa">mantissa ' + b.mantissa + "\u2082 = " + d.mantissaField + "</span>");
    var nb = neighboursBig(f, c);
    var nbHtml = d.kind === "nan" || d.kind === "infinity" ? "\u2013" :
      "below: " + (nb.down === null ? "none" : exactHtml(decodeBig(f, nb.down).value) + " (" + hexCode(f, nb.down) + ")") +
      "<br>above: " + (nb.up === null ? (f.infinities ? "+\u221e (overflow)" : "none: this is the largest value") :
                       exactHtml(decodeBig(f, nb.up).value) + " (" + hexCode(f, nb.up) + ")");
    var rows = [
      ["code", "code", "<code>" + hexCode(f, c) + "</code> = <code>" + [b.sign, b.exponent, b.mantissa].filter(Boolean).join(" ") + "</code>"],
      ["kind", "kind", d.kind === "nan" ? "NaN" : d.kind],
      ["fields", "fields", fields.join(" \u00b7 ")],
      ["formula", "formula", formulaParts(f, d).html],
      ["stored value (exact)", "exact", exactHtml(d.value)],
      ["neighbours", "neighbours", nbHtml],
      ["ulp", "ulp", d.value.special ? "\u2013" : exactHtml(ulpBig(f, d.value))]
    ];
    this.info.innerHTML = "<caption>" + escapeHtml(f.name) + ": " + f.bits + " bits = " + (f.signed ? "1 sign + " : "") +
      f.exponentBits + " exponent + " + f.mantissaBits + " mantissa, bias " + f.bias + "</caption>" +
      rows.map(function (r) { return '<tr data-row="' + r[1] + '"><th>' + r[0] + '</th><td data-out="' + r[1] + '">' + r[2] + "</td></tr>"; }).join("");
    this.renderRounding();
  };

  Explorer.prototype.renderRounding = function () {
    var f = this.fmt, x = this.typed;
    var cases = [["round to nearest, ties to even", "nearest_even", false],
                 ["round toward zero", "toward_zero", false],
                 ["nearest even, saturating", "nearest_even", true]];
    var rows = cases.map(function (cs) {
      var r;
      try { r = roundDetail(f, x, cs[1], cs[2]); } catch (err) {
        return '<tr><th>' + cs[0] + '</th><td colspan="3">' + escapeHtml(err.message) + "</td></tr>";
      }
      var err = r.error === null ? (x.special || r.decoded.value.special ? "\u2013" : "") :
        exactHtml(r.error) + (r.relative !== null && r.error.n !== ZERO ? ' <span class="mpt-be-approx">(relative \u2248 ' + approxString(r.relative, 3) + ")</span>" : "");
      return '<tr data-mode="' + cs[1] + (cs[2] ? "-saturate" : "") + '"><th>' + cs[0] + '</th><td data-out="code"><code>' +
        hexCode(f, r.code) + '</code></td><td data-out="value">' + exactHtml(r.decoded.value) + '</td><td data-out="error">' + err + "</td></tr>";
    });
    this.rounding.innerHTML = "<caption>x = " + exactHtml(x) + " rounded to " + escapeHtml(f.name) + "</caption>" +
      "<thead><tr><th>rounding</th><th>code</th><th>stored value</th><th>error (stored \u2212 x)</th></tr></thead><tbody>" +
      rows.join("") + "</tbody>";
  };

  // ---- mounting -------------------------------------------------------------------------------------------
  var scriptSrc = (document.currentScript && document.currentScript.src) || (function () {
    var ss = document.getElementsByTagName("script");
    for (var i = ss.length - 1; i >= 0; i--) if (/bit_explorer\.js(\?|#|$)/.test(ss[i].src)) return ss[i].src;
    return "";
  })();

  function ensureCss() {
    var links = document.querySelectorAll('link[rel="stylesheet"]');
    for (var i = 0; i < links.length; i++) if (/bit_explorer\.css(\?|#|$)/.test(links[i].href)) return;
    if (!scriptSrc) return;
    var link = el("link", {rel: "stylesheet", href: scriptSrc.replace(/bit_explorer\.js([?#].*)?$/, "bit_explorer.css")});
    document.head.appendChild(link);
  }

  function mount(host) {
    if (host.mptBitExplorer) return host.mptBitExplorer;
    ensureCss();
    host.mptBitExplorer = new Explorer(host);
    return host.mptBitExplorer;
  }

  function initAll(scope) {
    var nodes = (scope || document).querySelectorAll(".mpt-bit-explorer");
    var out = [];
    for (var i = 0; i < nodes.length; i++) out.push(mount(nodes[i]));
    return out;
  }

  root.MPTBitExplorer = {
    version: "1.0",
    formats: publicFormats(),
    order: ORDER.slice(),
    fieldNames: FIELD_NAMES.slice(),
    /** parse(text) → {type: "code", code: "0x…"} or {type: "value", exact: "…"} (throws on bad input) */
    parse: function (text) {
      var p = parse(text);
      return p.type === "code" ? {type: "code", code: "0x" + p.code.toString(16).toUpperCase()} : {type: "value", exact: exactString(p.value)};
    },
    /** decode(format, code) → {format, code, kind, sign, exponentField, mantissaField, unbiasedExponent, exact, bits, formula} */
    decode: publicDecode,
    /** round(format, value, mode = "nearest_even" | "toward_zero", saturate = false) → code as "0x…" */
    round: publicRound,
    /** roundDetail(format, value, mode, saturate) → {code, kind, exact, error, relative} (error = stored − value, exact) */
    roundDetail: function (fmtName, valueText, mode, saturate) {
      var f = getFormat(fmtName), r = roundDetail(f, parseValue(valueText), mode || "nearest_even", !!saturate);
      return {code: hexCode(f, r.code), kind: r.decoded.kind, exact: exactString(r.decoded.value),
              error: r.error === null ? null : exactString(r.error), relative: r.relative === null ? null : exactString(r.relative)};
    },
    /** neighbours(format, code) → {down, up}: the adjacent finite values {code, exact}, or null */
    neighbours: publicNeighbours,
    /** ulp(format, value) → exact decimal: 2^(clamp(floor(log2|x|), emin, emax) − m), as mpt_lab.formats.ulp */
    ulp: function (fmtName, valueText) { return exactString(ulpBig(getFormat(fmtName), parseValue(valueText))); },
    /** exact(value) → the typed value exactly (decimal, or "n/d"); hexFloat(value) → 0x1.8p+3 (dyadic values) */
    exact: function (valueText) { return exactString(parseValue(valueText)); },
    hexFloat: function (valueText) { return hexFloatString(parseValue(valueText)); },
    approx: function (valueText, digits) { return approxString(parseValue(valueText), digits); },
    mount: mount,
    initAll: initAll
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", function () { initAll(); });
  else initAll();
})(window);
