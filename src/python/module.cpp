#include "bindings.h"

PYBIND11_MODULE(_dlslime, m) {
  m.doc() = "DLSlime peer-to-peer transfer engine (C++ core)";
  m.attr("__version__") = DLSLIME_PY_VERSION;
  dlslime::py_bind::bind_core(m);
  // Before every transport's class: each derives from Endpoint.
  dlslime::py_bind::bind_endpoint(m);
  dlslime::py_bind::bind_transports(m);
  // After bind_core: its exception translator must be tried before bind_core's.
  dlslime::py_bind::bind_gpu(m);
#ifdef DLSLIME_WITH_TCP
  dlslime::py_bind::bind_tcp(m);
#endif
#ifdef DLSLIME_WITH_RDMA
  dlslime::py_bind::bind_rdma(m);
#endif
#ifdef DLSLIME_WITH_NVLINK
  dlslime::py_bind::bind_nvlink(m);
#endif
#ifdef DLSLIME_WITH_ASCEND
  dlslime::py_bind::bind_ascend(m);
#endif
#ifdef DLSLIME_WITH_NANOCTRL
  dlslime::py_bind::bind_nanoctrl(m);
  dlslime::py_bind::bind_agent(m);
#endif
}
