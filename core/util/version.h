#pragma once
// kvscope's version: one source of truth, project(VERSION) in the top CMakeLists.txt.

namespace kvscope {

inline constexpr const char* kVersion = KVSCOPE_VERSION;

}  // namespace kvscope
