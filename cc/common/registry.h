// Lookup by name in an algorithm registry (a vector of pointers to structs with a `name`).
#pragma once

#include <cstring>
#include <vector>

namespace jaxdnn {

template <typename Algo>
const Algo* find_by_name(const std::vector<const Algo*>& all, const char* name) {
  for (const Algo* a : all)
    if (std::strcmp(a->name, name) == 0) return a;
  return nullptr;
}

}  // namespace jaxdnn
