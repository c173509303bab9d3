// Stand-in for compile checks only (tests/ascend_sdk_stub/README.md): hicann/hixl
// include/adxl/adxl_engine.h in its first shape (TransferSync only).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "adxl_types.h"

namespace adxl {
class AdxlEngine {
 public:
  AdxlEngine();
  ~AdxlEngine();
  Status Initialize(const AscendString& local_engine, const std::map<AscendString, AscendString>& options);
  void Finalize();
  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& mem_handle);
  Status DeregisterMem(MemHandle mem_handle);
  Status Connect(const AscendString& remote_engine, int32_t timeout_in_millis = 1000);
  Status Disconnect(const AscendString& remote_engine, int32_t timeout_in_millis = 1000);
  Status TransferSync(const AscendString& remote_engine, TransferOp operation,
                      const std::vector<TransferOpDesc>& op_descs, int32_t timeout_in_millis = 1000);

 private:
  class AdxlEngineImpl;
  std::unique_ptr<AdxlEngineImpl> impl_;
};
}  // namespace adxl
