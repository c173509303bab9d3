// The simulated device's library called as any program calls libibverbs: through the
// exported verbs and the context's ops table, with rdma-core's own verbs.h. Each test shows
// that it refuses what the kernel and a NIC's provider refuse (docs/rdma.md, the table of
// checks), where the library's own adapter never goes.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "rdma/sim_device.h"

namespace {

dlslime::rdma::SimObjectCounts counts() {
  dlslime::rdma::SimObjectCounts c;
  dlslime_sim_rdma_object_counts(&c);
  return c;
}

// One context with a PD, a CQ on a non-blocking channel and an RC QP in RESET.
struct Rig {
  Rig() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    EXPECT_EQ(n, 1);
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    pd = ibv_alloc_pd(ctx);
    channel = ibv_create_comp_channel(ctx);
    ::fcntl(channel->fd, F_SETFL, ::fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
    cq = ibv_create_cq(ctx, 64, nullptr, channel, 0);
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap = {16, 16, 1, 1, 0};
    qp = ibv_create_qp(pd, &init);
  }
  ~Rig() {
    if (qp) ibv_destroy_qp(qp);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    ibv_destroy_comp_channel(channel);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
  int to_init() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }
  // RTR looped back to this QP itself (its own GID and QPN).
  ibv_qp_attr rtr_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = qp->qp_num;
    a.min_rnr_timer = 12;
    a.max_dest_rd_atomic = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.is_global = 1;
    ibv_gid_entry gid{};
    _ibv_query_gid_ex(ctx, 1, 0, &gid, 0, sizeof gid);
    a.ah_attr.grh.dgid = gid.gid;
    a.ah_attr.grh.hop_limit = 64;
    return a;
  }
  static constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  static constexpr int kRtsMask =
      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  int to_rts() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, kRtsMask);
  }

  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
};

ibv_qp_state state_of(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_qp(qp, &a, IBV_QP_STATE, &init), 0);
  return a.qp_state;
}

// The IB spec's modify table, as the kernel checks it: each transition has required and
// allowed attributes; a missing or an extra bit is EINVAL and the QP stays where it was.
TEST(SimIbverbsAbi, ModifyQpChecksTheAttributeMaskOfEachTransition) {
  Rig r;
  EXPECT_EQ(ibv_fork_init(), EINVAL);  // after a device was opened: too late, as rdma-core says
  EXPECT_EQ(counts().fork_init, 0);
  ASSERT_NE(r.qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  EXPECT_EQ(ibv_modify_qp(r.qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL);  // no PKEY_INDEX
  EXPECT_EQ(ibv_modify_qp(r.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                                        IBV_QP_SQ_PSN),
            EINVAL);  // SQ_PSN belongs to RTR->RTS
  EXPECT_EQ(state_of(r.qp), IBV_QPS_RESET);
  a.qp_state = IBV_QPS_RTR;  // RESET -> RTR is no transition
  EXPECT_EQ(ibv_modify_qp(r.qp, &a, IBV_QP_STATE), EINVAL);
  ASSERT_EQ(r.to_init(), 0);
  EXPECT_EQ(state_of(r.qp), IBV_QPS_INIT);

  ibv_qp_attr rtr = r.rtr_attr();
  EXPECT_EQ(ibv_modify_qp(r.qp, &rtr, Rig::kRtrMask & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
  EXPECT_EQ(ibv_modify_qp(r.qp, &rtr, Rig::kRtrMask | IBV_QP_TIMEOUT), EINVAL);
  rtr.cur_qp_state = IBV_QPS_RTS;  // a CUR_STATE that is not the QP's
  EXPECT_EQ(ibv_modify_qp(r.qp, &rtr, Rig::kRtrMask | IBV_QP_ACCESS_FLAGS | IBV_QP_CUR_STATE), EINVAL);
  EXPECT_EQ(state_of(r.qp), IBV_QPS_INIT);
  ASSERT_EQ(ibv_modify_qp(r.qp, &rtr, Rig::kRtrMask), 0);

  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(ibv_modify_qp(r.qp, &rts, Rig::kRtsMask & ~IBV_QP_RNR_RETRY), EINVAL);
  EXPECT_EQ(ibv_modify_qp(r.qp, &rts, Rig::kRtsMask | IBV_QP_DEST_QPN), EINVAL);
  EXPECT_EQ(state_of(r.qp), IBV_QPS_RTR);
  ASSERT_EQ(r.to_rts(), 0);
  EXPECT_EQ(state_of(r.qp), IBV_QPS_RTS);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(ibv_modify_qp(r.qp, &err, IBV_QP_STATE | IBV_QP_TIMEOUT), EINVAL);  // ->ERR takes the state alone
  EXPECT_EQ(ibv_modify_qp(r.qp, &err, IBV_QP_STATE), 0);
  EXPECT_EQ(state_of(r.qp), IBV_QPS_ERR);
  EXPECT_NE(std::strstr(dlslime_sim_rdma_last_error(), "does not take"), nullptr);  // the detail of the last refusal
}

// The data path goes through the context's ops table (verbs.h's inline calls), and the
// completion channel reports a CQ's event once it was armed.
TEST(SimIbverbsAbi, InlineVerbsDispatchThroughTheOpsTableAndTheChannelReportsTheCq) {
  Rig r;
  std::vector<uint8_t> buf(8192, 0);
  for (size_t i = 0; i < 4096; ++i) buf[i] = static_cast<uint8_t>(i * 7);
  r.mr = ibv_reg_mr(r.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(r.mr, nullptr);
  ASSERT_EQ(r.to_init(), 0);
  ibv_qp_attr rtr = r.rtr_attr();
  ASSERT_EQ(ibv_modify_qp(r.qp, &rtr, Rig::kRtrMask), 0);
  ASSERT_EQ(r.to_rts(), 0);
  ASSERT_EQ(ibv_req_notify_cq(r.cq, 0), 0);

  ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), 4096, r.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 42;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(buf.data() + 4096);
  wr.wr.rdma.rkey = r.mr->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(r.qp, &wr, &bad), 0);

  // Wait for the channel's event (deadline, no sleep-as-sync), then poll.
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ibv_get_cq_event(r.channel, &ev_cq, &ev_ctx) != 0) {
    ASSERT_EQ(errno, EAGAIN);
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "no completion event";
  }
  EXPECT_EQ(ev_cq, r.cq);
  ibv_wc wc{};
  ASSERT_EQ(ibv_poll_cq(r.cq, 1, &wc), 1);
  EXPECT_EQ(wc.wr_id, 42u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(std::memcmp(buf.data(), buf.data() + 4096, 4096), 0);

  // A CQ whose taken event was not acked: ibv_destroy_cq blocks for ever in libibverbs;
  // refused and counted here. Acked, it goes.
  const auto before = counts();
  EXPECT_EQ(ibv_destroy_qp(r.qp), 0);
  r.qp = nullptr;
  EXPECT_EQ(ibv_destroy_cq(r.cq), EBUSY);
  EXPECT_EQ(counts().destroy_failures, before.destroy_failures + 1);
  ibv_ack_cq_events(r.cq, 1);
  EXPECT_EQ(ibv_destroy_cq(r.cq), 0);
  r.cq = nullptr;
}

// The device's caps bound what it creates; a QP type or an opcode it lacks is refused (an
// atomic: EINVAL with bad_wr at it, the WRs before it posted).
TEST(SimIbverbsAbi, UnsupportedOpcodesQpTypesAndDeviceCapsAreRefusedAsAProviderRefusesThem) {
  Rig r;
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(r.ctx, &attr), 0);
  EXPECT_EQ(attr.max_qp_wr, static_cast<int>(dlslime::rdma::sim::kMaxQpWr));
  EXPECT_EQ(attr.max_cqe, dlslime::rdma::sim::kMaxCqe);
  EXPECT_EQ(attr.max_sge, static_cast<int>(dlslime::rdma::sim::kMaxSge));
  EXPECT_EQ(ibv_create_cq(r.ctx, attr.max_cqe + 1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_qp_init_attr ud{};
  ud.send_cq = r.cq;
  ud.recv_cq = r.cq;
  ud.qp_type = IBV_QPT_UD;
  EXPECT_EQ(ibv_create_qp(r.pd, &ud), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_qp_init_attr big = ud;
  big.qp_type = IBV_QPT_RC;
  big.cap.max_send_wr = static_cast<uint32_t>(attr.max_qp_wr) + 1;
  EXPECT_EQ(ibv_create_qp(r.pd, &big), nullptr);
  EXPECT_EQ(errno, EINVAL);

  ASSERT_EQ(r.to_init(), 0);
  ibv_qp_attr rtr = r.rtr_attr();
  ASSERT_EQ(ibv_modify_qp(r.qp, &rtr, Rig::kRtrMask), 0);
  ASSERT_EQ(r.to_rts(), 0);
  std::vector<uint8_t> buf(64);
  r.mr = ibv_reg_mr(r.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), 8, r.mr->lkey};
  ibv_send_wr second{};
  second.sg_list = &sge;
  second.num_sge = 1;
  second.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  ibv_send_wr first = second;
  first.opcode = IBV_WR_RDMA_WRITE;
  first.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(buf.data() + 32);
  first.wr.rdma.rkey = r.mr->rkey;
  first.send_flags = IBV_SEND_SIGNALED;
  first.next = &second;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(r.qp, &first, &bad), EINVAL);
  EXPECT_EQ(bad, &second);
  ibv_wc wc{};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ibv_poll_cq(r.cq, 1, &wc) == 0) ASSERT_LT(std::chrono::steady_clock::now(), until) << "the first WR never ran";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);  // the WR before it was posted and ran
}

// A context closed while its objects live is refused (EBUSY) and leaks, as on a NIC; so is
// a completion channel that CQs still report to.
TEST(SimIbverbsAbi, ParentsWithLiveChildrenAreRefusedAndLeak) {
  const auto before = counts();
  {
    Rig r;
    EXPECT_EQ(ibv_destroy_comp_channel(r.channel), EBUSY);
    EXPECT_EQ(ibv_close_device(r.ctx), EBUSY);
    EXPECT_EQ(counts().destroy_failures, before.destroy_failures + 2);
  }  // the rig destroys children first: nothing more is refused, nothing leaks
  const auto after = counts();
  EXPECT_EQ(after.destroy_failures, before.destroy_failures + 2);
  EXPECT_EQ(after.contexts, before.contexts);
  EXPECT_EQ(after.comp_channels, before.comp_channels);
  EXPECT_EQ(after.qps, before.qps);
}

}  // namespace
