# The engine library's dependencies (every one a Debian package, tools/setup installs them). Read
# twice from this one list: by the build (cmake/AtfillDeps.cmake) and by the installed
# atfillConfig.cmake, which finds them again for a program that links atfill::atfill. The caller
# defines atfill_dependency(NAME ARGS...) (find_package or find_dependency) and
# atfill_pkg_dependency(PREFIX MODULE) (pkg_check_modules with IMPORTED_TARGET, naming the target
# PkgConfig::PREFIX the exported targets refer to).
atfill_dependency(Threads)
atfill_dependency(OpenSSL 3)
atfill_dependency(simdjson)
atfill_dependency(zstd)
atfill_dependency(TBB)
atfill_dependency(CURL)
atfill_dependency(RocksDB)
atfill_dependency(SQLite3)
atfill_dependency(tomlplusplus)
atfill_dependency(Boost 1.74 COMPONENTS system)
atfill_dependency(PkgConfig)
atfill_pkg_dependency(LUA lua5.4)
atfill_pkg_dependency(LIBPQ libpq)
atfill_pkg_dependency(XXHASH libxxhash)
atfill_pkg_dependency(SECP256K1 libsecp256k1)
atfill_pkg_dependency(UTF8PROC libutf8proc)

# The same dependencies as pkg-config modules, for the installed atfill.pc (Boost.System and the
# threads library have none there: atfill.pc names them in Libs).
set(ATFILL_PC_REQUIRES
    "openssl simdjson libzstd tbb libcurl rocksdb sqlite3 tomlplusplus lua5.4 libpq libxxhash libsecp256k1 libutf8proc")
