# Third-party libraries. All come from distribution packages (see scripts/setup.sh).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()

# PCRE2 (8-bit code units, UTF mode) for the pre-tokenizer regular expressions.
# KILN_PCRE2_ROOT points at an unpacked package tree where the system has none.
find_path(PCRE2_INCLUDE_DIR pcre2.h HINTS ${KILN_PCRE2_ROOT}/include REQUIRED)
# From an unpacked package tree take the static library: its shared one points at a runtime
# package the tree may not hold.
if(KILN_PCRE2_ROOT)
  set(KILN_PCRE2_NAMES libpcre2-8.a pcre2-8)
else()
  set(KILN_PCRE2_NAMES pcre2-8 libpcre2-8.a)
endif()
find_library(PCRE2_LIBRARY NAMES ${KILN_PCRE2_NAMES}
             HINTS ${KILN_PCRE2_ROOT}/lib ${KILN_PCRE2_ROOT}/lib/x86_64-linux-gnu REQUIRED)
add_library(kiln_pcre2 INTERFACE)
target_include_directories(kiln_pcre2 INTERFACE ${PCRE2_INCLUDE_DIR})
target_link_libraries(kiln_pcre2 INTERFACE ${PCRE2_LIBRARY})
target_compile_definitions(kiln_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)

if(KILN_SERVER)
  find_path(HTTPLIB_INCLUDE_DIR httplib.h)
  if(NOT HTTPLIB_INCLUDE_DIR)
    message(STATUS "kiln: cpp-httplib not found, building without the HTTP server")
    set(KILN_SERVER OFF)
  endif()
endif()

if(KILN_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(KILN_BENCH)
  find_package(benchmark QUIET)
  if(NOT benchmark_FOUND)
    message(STATUS "kiln: Google Benchmark not found, micro-benchmarks are not built")
  endif()
endif()
