// Stand-in for compile checks only (tests/ascend_sdk_stub/README.md): the public declarations
// of hicann/hixl include/hixl/hixl_types.h (newest shape) that DLSlime uses.
#pragma once

#include <cstddef>
#include <cstdint>

#include "graph/ascend_string.h"

namespace hixl {
using Status = uint32_t;
using AscendString = ge::AscendString;
using TransferReq = void*;

constexpr const char OPTION_ENABLE_USE_FABRIC_MEM[] = "EnableUseFabricMem";
constexpr const char OPTION_RDMA_TRAFFIC_CLASS[] = "RdmaTrafficClass";
constexpr const char OPTION_RDMA_SERVICE_LEVEL[] = "RdmaServiceLevel";
constexpr const char OPTION_BUFFER_POOL[] = "BufferPool";
constexpr const char OPTION_GLOBAL_RESOURCE_CONFIG[] = "GlobalResourceConfig";
constexpr const char OPTION_AUTO_CONNECT[] = "AutoConnect";
constexpr const char OPTION_LOCAL_COMM_RES[] = "LocalCommRes";

constexpr Status SUCCESS = 0U;
constexpr Status PARAM_INVALID = 103900U;
constexpr Status TIMEOUT = 103901U;
constexpr Status NOT_CONNECTED = 103902U;
constexpr Status ALREADY_CONNECTED = 103903U;
constexpr Status NOTIFY_FAILED = 103904U;
constexpr Status UNSUPPORTED = 103905U;
constexpr Status FAILED = 503900U;
constexpr Status RESOURCE_EXHAUSTED = 203900U;

enum FeatureType : int32_t { AUTO_CONNECT = 0, CLIENT_SERVER_COMM = 1 };

using MemHandle = void*;
enum MemType { MEM_DEVICE, MEM_HOST };
enum TransferOp { READ, WRITE };

struct MemDesc {
  uintptr_t addr;
  size_t len;
  bool local_only = false;
  uint8_t reserved[127] = {};
};
struct TransferOpDesc {
  uintptr_t local_addr;
  uintptr_t remote_addr;
  size_t len;
};
enum class TransferStatus { WAITING, COMPLETED, TIMEOUT, FAILED };
struct TransferArgs {
  const void* user_data = nullptr;
  uint8_t reserved[120] = {};
};
struct GetTransferStatusArgs {
  uint32_t max_query_count = UINT32_MAX;
  bool skip_waiting = false;
  uint8_t reserved[123] = {};
};
struct TransferResult {
  TransferReq req = nullptr;
  const void* user_data = nullptr;
  TransferStatus status = TransferStatus::WAITING;
  uint8_t reserved[108] = {};
};
struct NotifyDesc {
  AscendString name;
  AscendString notify_msg;
};
}  // namespace hixl
