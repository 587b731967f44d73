// The crawl source moved to sources/crawl/crawl_source.hpp; include that.
#pragma once

#include "sources/crawl/crawl_source.hpp"
