# XGrammar's C++ library (grammar-constrained decoding: a token mask per step from a JSON schema),
# built from its PyPI source distribution, which scripts/install-deps.sh downloads to .deps/ and
# checks by SHA-256. Only its core: no Python bindings, tests or tracing. Defines `sluice_xgrammar`.
set(SLUICE_XGRAMMAR_SDIST "${CMAKE_SOURCE_DIR}/.deps/xgrammar-0.2.8.tar.gz")
set(SLUICE_XGRAMMAR_SHA256 8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80)
if(NOT EXISTS "${SLUICE_XGRAMMAR_SDIST}")
  message(FATAL_ERROR "${SLUICE_XGRAMMAR_SDIST} is missing: run scripts/install-deps.sh")
endif()
file(SHA256 "${SLUICE_XGRAMMAR_SDIST}" sluice_xgrammar_hash)
if(NOT sluice_xgrammar_hash STREQUAL SLUICE_XGRAMMAR_SHA256)
  message(FATAL_ERROR "${SLUICE_XGRAMMAR_SDIST} has the wrong SHA-256: run scripts/install-deps.sh")
endif()
set(SLUICE_XGRAMMAR_DIR "${CMAKE_BINARY_DIR}/_deps/xgrammar-0.2.8")
if(NOT EXISTS "${SLUICE_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h")
  file(ARCHIVE_EXTRACT INPUT "${SLUICE_XGRAMMAR_SDIST}" DESTINATION "${CMAKE_BINARY_DIR}/_deps")
endif()
# One fix to XGrammar 0.2.8: a JSON string with minLength/maxLength allowed raw control characters
# (U+0000-U+001F other than CR and LF), which JSON forbids unescaped, so documents failed to parse.
# The bounded string now excludes them as the unbounded one does.
set(sluice_xgrammar_converter "${SLUICE_XGRAMMAR_DIR}/cpp/json_schema_converter.cc")
file(READ "${sluice_xgrammar_converter}" sluice_xgrammar_text)
set(sluice_xgrammar_bug
    "builder_.AddCharacterClass({{'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);")
set(sluice_xgrammar_fix
    "builder_.AddCharacterClass({{0, 0x1f}, {'\"', '\"'}, {'\\\\', '\\\\'}}, true);")
string(FIND "${sluice_xgrammar_text}" "${sluice_xgrammar_bug}" sluice_xgrammar_at)
if(NOT sluice_xgrammar_at EQUAL -1)
  string(REPLACE "${sluice_xgrammar_bug}" "${sluice_xgrammar_fix}" sluice_xgrammar_text
         "${sluice_xgrammar_text}")
  file(WRITE "${sluice_xgrammar_converter}" "${sluice_xgrammar_text}")
else()
  string(FIND "${sluice_xgrammar_text}" "${sluice_xgrammar_fix}" sluice_xgrammar_at)
  if(sluice_xgrammar_at EQUAL -1)
    message(FATAL_ERROR "${sluice_xgrammar_converter}: the bounded-string line to fix is not there")
  endif()
endif()
file(GLOB sluice_xgrammar_sources CONFIGURE_DEPENDS
     "${SLUICE_XGRAMMAR_DIR}/cpp/*.cc" "${SLUICE_XGRAMMAR_DIR}/cpp/support/*.cc"
     "${SLUICE_XGRAMMAR_DIR}/cpp/converter_ext/*.cc")
add_library(sluice_xgrammar STATIC ${sluice_xgrammar_sources})
set_target_properties(sluice_xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
# Third-party code: its own warnings are not ours to fix.
target_compile_options(sluice_xgrammar PRIVATE -w)
target_compile_definitions(sluice_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0)
target_include_directories(sluice_xgrammar SYSTEM PUBLIC
  "${SLUICE_XGRAMMAR_DIR}/include" "${SLUICE_XGRAMMAR_DIR}/3rdparty/picojson"
  "${SLUICE_XGRAMMAR_DIR}/3rdparty/dlpack/include")
target_link_libraries(sluice_xgrammar PRIVATE Threads::Threads)
