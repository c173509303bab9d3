// Stand-in for compile checks only (tests/ascend_sdk_stub/README.md): the public declarations
// of hicann/hixl include/hixl/hixl.h (newest shape) that DLSlime uses or must not trip over
// (the second GetTransferStatus overload).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "hixl_types.h"

namespace hixl {
class Hixl {
 public:
  Hixl();
  ~Hixl();
  Status Initialize(const AscendString& local_engine, const std::map<AscendString, AscendString>& options);
  void Finalize();
  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& mem_handle);
  Status DeregisterMem(MemHandle mem_handle);
  Status Connect(const AscendString& remote_engine, int32_t timeout_in_millis = 1000);
  Status Disconnect(const AscendString& remote_engine, int32_t timeout_in_millis = 1000);
  Status TransferSync(const AscendString& remote_engine, TransferOp operation,
                      const std::vector<TransferOpDesc>& op_descs, int32_t timeout_in_millis = 1000);
  Status TransferAsync(const AscendString& remote_engine, TransferOp operation,
                       const std::vector<TransferOpDesc>& op_descs, const TransferArgs& optional_args,
                       TransferReq& req);
  Status GetTransferStatus(const TransferReq& req, TransferStatus& status);
  Status GetTransferStatus(const GetTransferStatusArgs& args, std::vector<TransferResult>& results);
  Status SendNotify(const AscendString& remote_engine, const NotifyDesc& notify, int32_t timeout_in_millis = 1000);
  Status GetNotifies(std::vector<NotifyDesc>& notifies);
  static Status GetCapability(FeatureType feature_type, int32_t& value);

 private:
  class HixlImpl;
  std::unique_ptr<HixlImpl> impl_;
};
}  // namespace hixl
