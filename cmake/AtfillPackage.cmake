# What `cmake --install` puts in a prefix (docs/embedding.md) and the Debian package carries
# (tools/package, docs/packaging.md): the launcher; the engine as one static library, libatfill.a,
# with its public headers, its CMake package (find_package(atfill)) and a pkg-config file; the
# docs, the examples, the demo's files and the Grafana dashboard. The package adds a systemd unit,
# an example config under /etc/atfill and its maintainer scripts.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The engine: the objects of the folder libraries a program builds and runs graphs with. The
# launcher's own parts (the admin server, simnet, the event generator) are not in it. In the tree,
# atfill::atfill names the same library, so examples/ links one target whether it is built here
# or against an installed atfill.
set(ATFILL_ENGINE_LIBRARIES atfill_base atfill_atproto atfill_net atfill_state atfill_pipeline
    atfill_sinks atfill_stages atfill_sources)
add_library(atfill_engine STATIC)
set(_engine_deps "")
foreach(lib IN LISTS ATFILL_ENGINE_LIBRARIES)
  target_sources(atfill_engine PRIVATE $<TARGET_OBJECTS:${lib}>)
  # What the folder libraries link from outside the engine (each other's are in the archive).
  get_target_property(_deps ${lib} INTERFACE_LINK_LIBRARIES)
  foreach(dep IN LISTS _deps)
    if(NOT dep MATCHES "^atfill_")
      list(APPEND _engine_deps ${dep})
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES _engine_deps)
target_link_libraries(atfill_engine PUBLIC ${_engine_deps})
target_include_directories(atfill_engine PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/atfill>)
target_compile_features(atfill_engine PUBLIC cxx_std_20)
set_target_properties(atfill_engine PROPERTIES OUTPUT_NAME atfill EXPORT_NAME atfill
  LINKER_LANGUAGE CXX)
add_library(atfill::atfill ALIAS atfill_engine)

# The public headers: those a program includes (docs/embedding.md lists them, and why), and the
# headers they include, found here by following their #include lines. Nothing else is installed;
# an edit to one of them configures again, so the set follows the includes.
set(ATFILL_PUBLIC_HEADERS
  base/status.hpp base/version.hpp
  pipeline/event.hpp pipeline/source.hpp pipeline/transform.hpp pipeline/sink.hpp
  pipeline/plan.hpp pipeline/run.hpp pipeline/components.hpp pipeline/process_state.hpp
  pipeline/job_controller.hpp pipeline/config.hpp pipeline/shard.hpp
  sources/components.hpp sources/files/event_file.hpp sources/jetstream/jetstream.hpp sources/archive/replay.hpp
  sources/crawl/crawl_source.hpp
  stages/components.hpp stages/cid_verify.hpp stages/ingest_guard.hpp stages/script/script.hpp
  stages/account_check.hpp
  sinks/components.hpp sinks/sqlite_sink.hpp sinks/sqlite_reader.hpp sinks/postgres_sink.hpp
  sinks/postgres_reader.hpp sinks/dry_run_sink.hpp
  state/kv_store.hpp state/tombstones.hpp state/job_store.hpp)
set(_generated_headers base/version.hpp)

function(atfill_include_closure out)
  set(todo ${ARGN})
  set(seen "")
  while(todo)
    list(POP_FRONT todo header)
    if(header IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${header})
    if(header IN_LIST _generated_headers)
      continue()
    endif()
    set(path ${PROJECT_SOURCE_DIR}/${header})
    if(NOT EXISTS ${path})
      message(FATAL_ERROR "public header ${header} (or one it includes) does not exist")
    endif()
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})
    file(STRINGS ${path} includes REGEX "^#include \"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" included "${line}")
      list(APPEND todo ${included})
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()
atfill_include_closure(_installed_headers ${ATFILL_PUBLIC_HEADERS})
set(_include_dest ${CMAKE_INSTALL_INCLUDEDIR}/atfill)
foreach(header IN LISTS _installed_headers)
  get_filename_component(dir ${header} DIRECTORY)
  if(header IN_LIST _generated_headers)
    install(FILES ${PROJECT_BINARY_DIR}/generated/${header} DESTINATION ${_include_dest}/${dir})
  else()
    install(FILES ${header} DESTINATION ${_include_dest}/${dir})
  endif()
endforeach()

# The library, the launcher and the CMake package.
set(_cmake_dest ${CMAKE_INSTALL_LIBDIR}/cmake/atfill)
install(TARGETS atfill_engine EXPORT atfillTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS atfill RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT atfillTargets NAMESPACE atfill:: DESTINATION ${_cmake_dest})
configure_package_config_file(cmake/atfillConfig.cmake.in
  ${PROJECT_BINARY_DIR}/atfillConfig.cmake INSTALL_DESTINATION ${_cmake_dest})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/atfillConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/atfillConfig.cmake ${PROJECT_BINARY_DIR}/atfillConfigVersion.cmake
  cmake/AtfillEngineDeps.cmake DESTINATION ${_cmake_dest})

# pkg-config: the prefix is found from the .pc file's own place, so the tree can move.
file(RELATIVE_PATH ATFILL_PC_PREFIX ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig
  ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" ATFILL_PC_PREFIX "${ATFILL_PC_PREFIX}")
configure_file(cmake/atfill.pc.in ${PROJECT_BINARY_DIR}/atfill.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/atfill.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Docs, the examples (a standalone CMake project, docs/embedding.md), the demo's files (the
# installed launcher finds them beside itself), the Grafana dashboard.
install(FILES README.md docs/guide.md docs/config.md docs/queries.md docs/scripts.md
  docs/postgres.md docs/admin.md docs/performance.md docs/embedding.md docs/packaging.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES examples/CMakeLists.txt examples/embed_batch.cpp examples/embed_config.cpp
  DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(FILES examples/data/records.jsonl examples/data/sample.car examples/data/sample.key
  DESTINATION ${CMAKE_INSTALL_DATADIR}/atfill/demo)
install(FILES contrib/grafana/atfill.json DESTINATION ${CMAKE_INSTALL_DATADIR}/atfill/grafana)

# Only in the Debian package (the "service" component, left out of a plain `cmake --install`):
# the systemd unit, the example config (a conffile) and the files Debian asks of every package.
set(_deb ${PROJECT_SOURCE_DIR}/contrib/debian)
install(FILES contrib/systemd/atfill.service DESTINATION /lib/systemd/system
  COMPONENT service EXCLUDE_FROM_ALL)
install(FILES contrib/config/atfill.toml DESTINATION /etc/atfill COMPONENT service EXCLUDE_FROM_ALL)
install(FILES ${_deb}/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR}
  COMPONENT service EXCLUDE_FROM_ALL)
install(FILES ${_deb}/atfill.lintian-overrides DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides
  RENAME atfill COMPONENT service EXCLUDE_FROM_ALL)
# The changelog Debian requires, made from the project's version; its date is the build's
# (SOURCE_DATE_EPOCH when set, for reproducible packages).
set(ATFILL_PACKAGE_MAINTAINER "atfill developers <atfill@invalid.example>" CACHE STRING
  "The Maintainer field of the Debian package")
string(TIMESTAMP ATFILL_PACKAGE_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(${_deb}/changelog.in ${PROJECT_BINARY_DIR}/debian/changelog.Debian @ONLY)
add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/debian/changelog.Debian.gz
  COMMAND gzip -n -9 -f -k ${PROJECT_BINARY_DIR}/debian/changelog.Debian
  DEPENDS ${PROJECT_BINARY_DIR}/debian/changelog.Debian VERBATIM)
add_custom_target(atfill_debian_changelog ALL DEPENDS ${PROJECT_BINARY_DIR}/debian/changelog.Debian.gz)
install(FILES ${PROJECT_BINARY_DIR}/debian/changelog.Debian.gz DESTINATION ${CMAKE_INSTALL_DOCDIR}
  COMPONENT service EXCLUDE_FROM_ALL)

set(CPACK_PACKAGE_NAME atfill)
set(CPACK_PACKAGE_VENDOR atfill)
set(CPACK_PACKAGE_CONTACT "${ATFILL_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "AT Protocol backfill and live indexer")
set(CPACK_PACKAGE_DESCRIPTION "\
atfill backfills and live-indexes AT Protocol (Bluesky) records into SQLite or
PostgreSQL: a crawl of the network, Jetstream streams and archive replays, with
crash-safe resumable jobs, an admin API and Prometheus metrics.
.
This package holds the atfill launcher and its systemd service, and the engine
as a static library with its headers, CMake package and pkg-config file for
programs that embed it.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
# All components in one package: the plain install and the service component.
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_COMPONENTS_ALL Unspecified service)
set(CPACK_DEBIAN_PACKAGE_NAME atfill)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The run-time libraries come from dpkg-shlibdeps (libsqlite3-0, librocksdb7.8, libtbb12, libpq5,
# libcurl4, libzstd1, liblua5.4-0...); adduser makes the service's user in postinst.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
# What a program that embeds the library needs to build (the headers of the dependencies).
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "g++, cmake, pkg-config, libtbb-dev, libcurl4-openssl-dev, \
libsimdjson-dev, librocksdb-dev, libsqlite3-dev, libzstd-dev, libssl-dev, liblua5.4-dev, libpq-dev, \
libboost-system-dev, libtomlplusplus-dev, libxxhash-dev, libsecp256k1-dev, libutf8proc-dev")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${_deb}/postinst ${_deb}/prerm ${_deb}/postrm
  ${_deb}/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_OUTPUT_FILE_PREFIX ${PROJECT_BINARY_DIR}/packages)
include(CPack)
