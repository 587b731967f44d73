# Every dependency is a Debian package (tools/setup installs them); none is vendored or fetched.
# The engine's own (cmake/AtfillEngineDeps.cmake) are found again by the installed package config.
macro(atfill_dependency name)
  find_package(${name} ${ARGN} REQUIRED)
endmacro()
macro(atfill_pkg_dependency prefix module)
  pkg_check_modules(${prefix} REQUIRED IMPORTED_TARGET ${module})
endmacro()
include(AtfillEngineDeps)

# The launcher's tools only: the admin server's metrics, the command line.
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
if(ATFILL_BUILD_TESTS)
  find_package(GTest REQUIRED)
  # The HTTP client of the admin and live tests.
  pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
endif()
if(ATFILL_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
