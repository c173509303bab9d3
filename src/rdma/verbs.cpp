// Names and provider selection for the verbs seam (verbs.h).
#include "rdma/verbs.h"

#include <fmt/format.h>

#include "core/env.h"

namespace dlslime::rdma {

const char* port_state_name(PortState state) noexcept {
  switch (state) {
    case PortState::kDown: return "DOWN";
    case PortState::kInit: return "INIT";
    case PortState::kArmed: return "ARMED";
    case PortState::kActive: return "ACTIVE";
    case PortState::kOther: return "OTHER";
  }
  return "?";
}

const char* link_layer_name(LinkLayer layer) noexcept {
  switch (layer) {
    case LinkLayer::kUnspecified: return "unspecified";
    case LinkLayer::kInfiniBand: return "InfiniBand";
    case LinkLayer::kEthernet: return "Ethernet";
  }
  return "?";
}

const char* gid_type_name(GidType type) noexcept {
  switch (type) {
    case GidType::kUnknown: return "unknown";
    case GidType::kIb: return "IB";
    case GidType::kRoceV1: return "RoCE v1";
    case GidType::kRoceV2: return "RoCE v2";
  }
  return "?";
}

bool GidEntry::empty() const noexcept {
  for (uint8_t b : gid) {
    if (b != 0) return false;
  }
  return true;
}

std::string gid_to_string(const GidBytes& gid) {
  std::string out;
  for (size_t i = 0; i < gid.size(); i += 2) {
    if (i) out += ':';
    out += fmt::format("{:02x}{:02x}", gid[i], gid[i + 1]);
  }
  return out;
}

const char* qp_state_name(QpState state) noexcept {
  switch (state) {
    case QpState::kReset: return "RESET";
    case QpState::kInit: return "INIT";
    case QpState::kRtr: return "RTR";
    case QpState::kRts: return "RTS";
    case QpState::kErr: return "ERR";
  }
  return "?";
}

const char* wc_status_name(WcStatus status) noexcept {
  switch (status) {
    case WcStatus::kSuccess: return "SUCCESS";
    case WcStatus::kLocLenErr: return "LOC_LEN_ERR";
    case WcStatus::kLocQpOpErr: return "LOC_QP_OP_ERR";
    case WcStatus::kLocProtErr: return "LOC_PROT_ERR";
    case WcStatus::kWrFlushErr: return "WR_FLUSH_ERR";
    case WcStatus::kRemInvReqErr: return "REM_INV_REQ_ERR";
    case WcStatus::kRemAccessErr: return "REM_ACCESS_ERR";
    case WcStatus::kRemOpErr: return "REM_OP_ERR";
    case WcStatus::kRetryExcErr: return "RETRY_EXC_ERR";
    case WcStatus::kRnrRetryExcErr: return "RNR_RETRY_EXC_ERR";
    case WcStatus::kGeneralErr: return "GENERAL_ERR";
  }
  return "?";
}

const char* wc_opcode_name(WcOpcode opcode) noexcept {
  switch (opcode) {
    case WcOpcode::kSend: return "SEND";
    case WcOpcode::kRdmaWrite: return "RDMA_WRITE";
    case WcOpcode::kRdmaRead: return "RDMA_READ";
    case WcOpcode::kRecv: return "RECV";
    case WcOpcode::kRecvRdmaWithImm: return "RECV_RDMA_WITH_IMM";
  }
  return "?";
}

// Strict (core/env.h): "true" or "yes" is an InvalidArgumentError naming the variable, never
// a silent choice of the real device.
bool sim_selected() { return env_flag("DLSLIME_RDMA_SIM"); }

Provider& provider() { return sim_selected() ? sim_provider() : ibverbs_provider(); }

}  // namespace dlslime::rdma
