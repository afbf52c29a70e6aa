// Algorithm names and their kernel variants, shared by the CPU and CUDA registries.
//
// Grammar:  name := base ("." option)*
//   e.g. "implicit_precomp_gemm", "implicit_precomp_gemm.mma_sync",
//        "implicit_precomp_gemm.wgmma.im2col_tma.tma_b.128x128.ws", "im2col_gemm.avx2"
// Each option pins one field of Variant (conv.h); an algorithm takes the options it lists in
// Algo::options. Its resolve(args) gives, with the pins of args.variant and the auto choices
// made for this problem and GPU or CPU, every option of the variant that runs: the concrete name,
// base + resolve(args), pins all of them, so it names exactly the kernels that run. explain
// shows it, find times it, the tuning cache stores it, and the custom call carries it.
// A name runs a problem only if each of its options appears in its concrete name: an option
// that cannot apply (wgmma off Hopper, 128x256 tiles without 256 columns) makes the name
// unsupported, with the concrete name in the reason; so does one the hardware lacks (avx512 on
// a CPU without AVX-512), through the algorithm's supports().
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cc/conv/conv.h"

namespace jaxdnn::conv {

// An option sets one field of Variant: a Pin (pin, value), else tile_n (tile_n != 0), else isa.
struct OptionSpec {
  const char* token;
  Pin Variant::*pin;
  Pin value;
  int tile_n;
  CpuIsa isa = CpuIsa::kAuto;
};

inline constexpr OptionSpec kOptionSpecs[] = {
    {"wgmma", &Variant::wgmma, Pin::kOn, 0},         {"mma_sync", &Variant::wgmma, Pin::kOff, 0},
    {"im2col_tma", &Variant::im2col, Pin::kOn, 0},   {"table", &Variant::im2col, Pin::kOff, 0},
    {"tma_b", &Variant::tma_b, Pin::kOn, 0},         {"gather_b", &Variant::tma_b, Pin::kOff, 0},
    {"128x64", nullptr, Pin::kAuto, 64},             {"128x128", nullptr, Pin::kAuto, 128},
    {"128x256", nullptr, Pin::kAuto, 256},           {"ws", &Variant::ws, Pin::kOn, 0},
    {"no_ws", &Variant::ws, Pin::kOff, 0},           {"class_rows", &Variant::class_rows, Pin::kOn, 0},
    {"scatter", &Variant::class_rows, Pin::kOff, 0}, {"halo", &Variant::halo, Pin::kOn, 0},
    {"no_halo", &Variant::halo, Pin::kOff, 0},
    {"generic", nullptr, Pin::kAuto, 0, CpuIsa::kGeneric},
    {"avx2", nullptr, Pin::kAuto, 0, CpuIsa::kAvx2},
    {"avx512", nullptr, Pin::kAuto, 0, CpuIsa::kAvx512},
};

// The words of `text` separated by `sep`.
inline std::vector<std::string_view> split_words(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const size_t at = text.find(sep);
    if (at != 0) out.push_back(text.substr(0, at));
    if (at == std::string_view::npos) break;
    text.remove_prefix(at + 1);
  }
  return out;
}

inline bool contains_word(std::string_view text, char sep, std::string_view word) {
  for (std::string_view w : split_words(text, sep))
    if (w == word) return true;
  return false;
}

inline bool is_pinned(const Variant& v, const OptionSpec& o) {
  if (o.pin != nullptr) return v.*o.pin == o.value;
  return o.tile_n != 0 ? v.tile_n == o.tile_n : v.isa == o.isa;
}

// Whether the field that option o sets is pinned in v (to o or to another option).
inline bool is_set(const Variant& v, const OptionSpec& o) {
  if (o.pin != nullptr) return v.*o.pin != Pin::kAuto;
  return o.tile_n != 0 ? v.tile_n != 0 : v.isa != CpuIsa::kAuto;
}

inline void pin(Variant* v, const OptionSpec& o) {
  if (o.pin != nullptr) v->*o.pin = o.value;
  else if (o.tile_n != 0) v->tile_n = o.tile_n;
  else v->isa = o.isa;
}

inline const OptionSpec* find_option(std::string_view token) {
  for (const OptionSpec& o : kOptionSpecs)
    if (token == o.token) return &o;
  return nullptr;
}

// The algorithm of `all` named by `name` (base and options), with the options' pins in
// *variant; nullptr and *error when the base is unknown or an option is not the algorithm's or
// conflicts with an earlier one.
template <typename Algo>
const Algo* find_algorithm(const std::vector<const Algo*>& all, std::string_view name,
                           Variant* variant, std::string* error) {
  const std::vector<std::string_view> parts = split_words(name, '.');
  const Algo* alg = nullptr;
  for (const Algo* a : all)
    if (!parts.empty() && parts[0] == a->name) alg = a;
  if (alg == nullptr) {
    *error = "unknown algorithm '" + std::string(name) + "'";
    return nullptr;
  }
  *variant = Variant{};
  for (size_t i = 1; i < parts.size(); ++i) {
    const OptionSpec* o = find_option(parts[i]);
    if (o == nullptr || !contains_word(alg->options, ' ', parts[i])) {
      *error = "algorithm '" + std::string(alg->name) + "' has no option '" +
               std::string(parts[i]) + "' (options: " +
               (alg->options[0] ? alg->options : "none") + ")";
      return nullptr;
    }
    if (is_set(*variant, *o) && !is_pinned(*variant, *o)) {
      *error = "'" + std::string(name) + "' pins option '" + std::string(parts[i]) +
               "' against an earlier one";
      return nullptr;
    }
    pin(variant, *o);
  }
  return alg;
}

// The concrete name of the variant of `a` that runs `args`.
template <typename Algo>
std::string concrete_name(const Algo& a, const Args& args) {
  return std::string(a.name) + (a.resolve != nullptr ? a.resolve(args) : "");
}

// An empty problem: no output element, or nothing in each output's sum (no input pixel, no
// channel or no filter tap).
inline bool is_empty(const Problem& p) {
  bool empty = p.N == 0 || p.K == 0 || p.C == 0;
  for (int a = 0; a < 3; ++a) empty = empty || p.in[a] == 0 || p.filt[a] == 0 || p.out[a] == 0;
  return empty;
}

// Whether algorithm `a` of a registry runs `args` (with the pins of args.variant): its own
// supports(), behind the rule of its registry for empty problems, and every pinned option in
// its concrete name. A registry whose algorithms tile the problem (Algo::kTiledEmpty: the CUDA
// one, whose plans divide by tile and slice counts) runs empty problems on `direct` alone, which
// loops over the outputs and writes zeros where a sum is empty. Every caller asks through this.
template <typename Algo>
Support algorithm_supports(const Algo& a, const Args& args) {
  if (Algo::kTiledEmpty && is_empty(args.p) && std::string(a.name) != "direct")
    return Support::No("the problem is empty (no output, or nothing to sum): direct runs it");
  Support s = a.supports(args);
  if (!s.ok) return s;
  const std::string concrete = concrete_name(a, args);
  for (const OptionSpec& o : kOptionSpecs)
    if (is_pinned(args.variant, o) && !contains_word(concrete, '.', o.token))
      return Support::No("option '" + std::string(o.token) +
                         "' does not apply to this problem, which runs as " + concrete);
  return s;
}

// One name of a registry's algorithm for a problem, as the listings report it.
template <typename Algo>
struct Listed {
  const Algo* alg;       // nullptr: the name is unknown (support.reason says why)
  std::string name;      // the concrete name where supported, else the name as asked
  Args args;             // the problem with the name's pins
  Support support;
  bool is_default;       // a base name, or the variant its base name runs
};

template <typename Algo>
Listed<Algo> describe_name(const std::vector<const Algo*>& all, const Args& args,
                           std::string_view name) {
  Listed<Algo> l{nullptr, std::string(name), args, Support::No(""), false};
  std::string error;
  l.alg = find_algorithm(all, name, &l.args.variant, &error);
  if (l.alg == nullptr) {
    l.support = Support::No(error);
    return l;
  }
  l.support = algorithm_supports(*l.alg, l.args);
  if (l.support.ok) {
    l.name = concrete_name(*l.alg, l.args);
    find_algorithm(all, l.name, &l.args.variant, &error);  // every pin of the concrete name
  }
  l.is_default = name.find('.') == std::string_view::npos ||
                 (l.support.ok && l.name == concrete_name(*l.alg, args));
  return l;
}

// Every algorithm of `all` for `args` (no pins), its default variant first; with `variants`,
// also every variant that can run (reached by pinning its options one at a time from the
// default and from each variant found), and each single option that cannot apply to the
// default, with the reason.
template <typename Algo>
std::vector<Listed<Algo>> list_algorithms(const std::vector<const Algo*>& all, const Args& args,
                                          bool variants) {
  std::vector<Listed<Algo>> out;
  for (const Algo* a : all) {
    const size_t first = out.size();
    out.push_back(describe_name(all, args, a->name));
    if (!variants || !out.back().support.ok) continue;
    for (size_t i = first; i < out.size(); ++i) {  // out grows while it is walked
      if (!out[i].support.ok) continue;
      for (std::string_view token : split_words(a->options, ' ')) {
        std::string name = std::string(a->name) + "." + std::string(token);
        if (i != first) {  // reasons are given against the default only
          Args pinned = out[i].args;
          pin(&pinned.variant, *find_option(token));
          if (!algorithm_supports(*a, pinned).ok) continue;
          name = concrete_name(*a, pinned);
        }
        const Listed<Algo> l = describe_name(all, args, name);
        bool seen = false;
        for (size_t j = first; j < out.size() && !seen; ++j) seen = out[j].name == l.name;
        if (!seen) out.push_back(l);
      }
    }
  }
  return out;
}

}  // namespace jaxdnn::conv
