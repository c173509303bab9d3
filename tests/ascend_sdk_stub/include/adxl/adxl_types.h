// Stand-in for compile checks only (tests/ascend_sdk_stub/README.md): hicann/hixl
// include/adxl/adxl_types.h in its FIRST shape (CANN 8.2 era: no TransferAsync, no notifies,
// no TransferArgs/TransferStatus/NotifyDesc), so the plugin's sync-only branch is checked.
#pragma once

#include <cstddef>
#include <cstdint>

#include "graph/ascend_string.h"

namespace adxl {
using Status = uint32_t;
using AscendString = ge::AscendString;

constexpr const char OPTION_RDMA_TRAFFIC_CLASS[] = "adxl.RdmaTrafficClass";
constexpr const char OPTION_RDMA_SERVICE_LEVEL[] = "adxl.RdmaServiceLevel";
constexpr const char OPTION_BUFFER_POOL[] = "adxl.BufferPool";

constexpr Status SUCCESS = 0U;
constexpr Status PARAM_INVALID = 103900U;
constexpr Status TIMEOUT = 103901U;
constexpr Status NOT_CONNECTED = 103902U;
constexpr Status ALREADY_CONNECTED = 103903U;
constexpr Status NOTIFY_FAILED = 103904U;
constexpr Status UNSUPPORTED = 103905U;
constexpr Status FAILED = 503900U;

using MemHandle = void*;
enum MemType { MEM_DEVICE, MEM_HOST };
enum TransferOp { READ, WRITE };
struct MemDesc {
  uintptr_t addr;
  size_t len;
  uint8_t reserved[128] = {};
};
struct TransferOpDesc {
  uintptr_t local_addr;
  uintptr_t remote_addr;
  size_t len;
};
}  // namespace adxl
