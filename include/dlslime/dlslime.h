#pragma once

// Umbrella header for applications.
#include "dlslime/endpoint.h"
#include "dlslime/errors.h"
#include "dlslime/future.h"
#include "dlslime/logging.h"
#include "dlslime/status.h"
#include "dlslime/tcp_endpoint.h"
#include "dlslime/transport.h"
#include "dlslime/version.h"
