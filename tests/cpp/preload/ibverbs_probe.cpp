// A program linked against rdma-core's libibverbs.so.1 and nothing of DLSlime, as another
// project's test binary is. Run with LD_PRELOAD=libdlslime_sim_ibverbs.so (docs/rdma.md), its
// verbs reach the simulated device: it finds sim_rdma0, loops an RC QP back to itself, moves
// bytes with an RDMA write (ibv_post_send and ibv_poll_cq are verbs.h inlines: they dispatch
// through the context's ops table) and tears down in order. Prints "moved N bytes" or why not.
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "ibverbs_probe: %s\n", what);
  return 1;
}

}  // namespace

int main() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n != 1 || std::strcmp(ibv_get_device_name(list[0]), "sim_rdma0") != 0) {
    return fail("expected exactly the simulated device sim_rdma0 (is LD_PRELOAD set?)");
  }
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx == nullptr) return fail("ibv_open_device");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
  if (cq == nullptr) return fail("ibv_alloc_pd / ibv_create_cq");
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (qp == nullptr) return fail("ibv_create_qp");

  std::vector<char> buf(8192, 0);
  for (size_t i = 0; i < 4096; ++i) buf[i] = static_cast<char>(i * 7 + 1);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (mr == nullptr) return fail("ibv_reg_mr");

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    return fail("RESET -> INIT");
  }
  ibv_gid gid{};
  if (ibv_query_gid(ctx, 1, 0, &gid) != 0) return fail("ibv_query_gid");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = qp->qp_num;  // looped back to itself
  a.min_rnr_timer = 12;
  a.max_dest_rd_atomic = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.hop_limit = 64;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    return fail("INIT -> RTR");
  }
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    return fail("RTR -> RTS");
  }

  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 4096, mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 42;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf.data() + 4096);
  wr.wr.rdma.rkey = mr->rkey;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp, &wr, &bad) != 0) return fail("ibv_post_send");
  ibv_wc wc{};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int polled = 0;
  while ((polled = ibv_poll_cq(cq, 1, &wc)) == 0) {
    if (std::chrono::steady_clock::now() > until) return fail("no completion within 30 s");
  }
  if (polled != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != 42) return fail("the write's completion");
  if (std::memcmp(buf.data(), buf.data() + 4096, 4096) != 0) return fail("the written bytes differ");

  if (ibv_destroy_qp(qp) != 0 || ibv_dereg_mr(mr) != 0 || ibv_destroy_cq(cq) != 0 || ibv_dealloc_pd(pd) != 0 ||
      ibv_close_device(ctx) != 0) {
    return fail("teardown");
  }
  std::printf("moved 4096 bytes through sim_rdma0\n");
  return 0;
}
