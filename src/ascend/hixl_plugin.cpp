// libdlslime_ascend_hixl.so: the one place that links Huawei's transfer library
// (library_loader.h says why a plugin). It adapts hixl::Hixl (CANN >= 8.5, libcann_hixl.so)
// or adxl::AdxlEngine (CANN >= 8.2, libllm_datadist.so), chosen at build time with
// DLSLIME_HIXL_FLAVOUR=hixl|adxl, to the HixlEngine seam: strings become AscendStrings, our
// structs become theirs, status codes pass through unchanged (they are the values the seam's
// HixlStatus declares, in both libraries).
//
// It depends on nothing in libdlslime (whose internal symbols are hidden): only the standard
// library, the CANN headers and the seam's header. Nothing here throws past the C entry points
// or the seam: a std::bad_alloc inside the library becomes FAILED.
//
// Versions: both libraries grew after their first release. TransferAsync, GetTransferStatus,
// SendNotify and GetNotifies (and their types TransferArgs, TransferStatus, NotifyDesc) are
// missing from the first HIXL and from ADXL before CANN 8.3. This file names those types only
// through the engine class's own member declarations (deduced in templates), so it builds
// against either generation and reports what the headers had in GetCapability().
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <acl/acl.h>

#include "ascend/hixl_engine.h"
#include "ascend/library_loader.h"

#define DLSLIME_FLAVOUR_hixl 1
#define DLSLIME_FLAVOUR_adxl 2
#define DLSLIME_FLAVOUR_CAT(a, b) a##b
#define DLSLIME_FLAVOUR_ID(f) DLSLIME_FLAVOUR_CAT(DLSLIME_FLAVOUR_, f)

#if !defined(DLSLIME_HIXL_FLAVOUR)
#error "DLSLIME_HIXL_FLAVOUR must be hixl (CANN >= 8.5) or adxl (CANN >= 8.2)"
#elif DLSLIME_FLAVOUR_ID(DLSLIME_HIXL_FLAVOUR) == DLSLIME_FLAVOUR_hixl
#include <hixl/hixl.h>
namespace vendor = ::hixl;
using VendorEngine = ::hixl::Hixl;
#define DLSLIME_FLAVOUR_NAME "hixl"
#define DLSLIME_FLAVOUR_LIBRARY "libcann_hixl.so"
#elif DLSLIME_FLAVOUR_ID(DLSLIME_HIXL_FLAVOUR) == DLSLIME_FLAVOUR_adxl
#include <adxl/adxl_engine.h>
namespace vendor = ::adxl;
using VendorEngine = ::adxl::AdxlEngine;
#define DLSLIME_FLAVOUR_NAME "adxl"
#define DLSLIME_FLAVOUR_LIBRARY "libllm_datadist.so"
#else
#error "DLSLIME_HIXL_FLAVOUR must be hixl (CANN >= 8.5) or adxl (CANN >= 8.2)"
#endif

namespace dlslime::ascend {
namespace {

thread_local std::string t_last_error;

uint32_t fail(uint32_t status, std::string why) {
  t_last_error = std::move(why);
  return status;
}

// The ACL runtime's text for the last failure on this thread, or "".
std::string acl_message() {
  const char* m = aclGetRecentErrMsg();
  return m ? std::string(m) : std::string();
}

// --- the library's types, deduced from its member declarations -----------------------------

template <class C, class R, class... A>
std::tuple<A...> params_of(R (C::*)(A...));
template <class E, auto Member, size_t I>
using Param = std::remove_cvref_t<std::tuple_element_t<I, decltype(params_of<E>(Member))>>;

// GetTransferStatus is overloaded in newer headers (one request, or all of them): deduction
// against this shape picks the one-request overload and yields its TransferStatus type.
template <class C, class S>
S status_out(uint32_t (C::*)(void* const&, S&));

template <class E>
concept HasTransferAsync = requires { &E::TransferAsync; };
template <class E>
concept HasNotify = requires {
  &E::SendNotify;
  &E::GetNotifies;
};

// An AscendString's bytes, NULs included (GetLength), or "" for an empty one.
template <class S>
std::string text(const S& s) {
  const char* p = s.GetString();
  return p ? std::string(p, s.GetLength()) : std::string();
}

// The option keys the seam takes are HIXL's (hixl_types.h). ADXL spells four of them with an
// "adxl." prefix (adxl_types.h) and lacks the rest; a key the library does not know is
// UNSUPPORTED here rather than silently ignored by it.
uint32_t vendor_options(const EngineOptions& in, std::map<vendor::AscendString, vendor::AscendString>& out) {
  for (const auto& [key, value] : in) {
    std::string name = key;
#if DLSLIME_FLAVOUR_ID(DLSLIME_HIXL_FLAVOUR) == DLSLIME_FLAVOUR_adxl
    if (key == "RdmaTrafficClass" || key == "RdmaServiceLevel" || key == "BufferPool" || key == "LocalCommRes") {
      name = "adxl." + key;
    } else if (key != "AutoConnect") {
      return fail(kHixlUnsupported, "option " + key + " is HIXL's (CANN >= 8.5); ADXL has no such option");
    }
#endif
    out[vendor::AscendString(name.c_str())] = vendor::AscendString(value.c_str());
  }
  return kHixlSuccess;
}

vendor::TransferOp vendor_op(TransferOp op) { return op == TransferOp::kRead ? vendor::READ : vendor::WRITE; }

std::vector<vendor::TransferOpDesc> vendor_descs(const std::vector<TransferOpDesc>& descs) {
  std::vector<vendor::TransferOpDesc> out(descs.size());
  for (size_t i = 0; i < descs.size(); ++i) {
    out[i].local_addr = descs[i].local_addr;
    out[i].remote_addr = descs[i].remote_addr;
    out[i].len = descs[i].len;
  }
  return out;
}

template <class E>
class LibraryEngine final : public HixlEngine {
 public:
  ~LibraryEngine() override { Finalize(); }

  uint32_t Initialize(const std::string& local_engine, const EngineOptions& options) override {
    return guarded([&]() -> uint32_t {
      if (engine_) return fail(kHixlParamInvalid, "Initialize was called twice on one engine");
      // The library binds its streams to the ACL context current at Initialize; its later
      // calls from another thread need that context made current there (its docs:
      // aclrtGetCurrentContext here, aclrtSetCurrentContext there). Without a device set on
      // this thread there is no context to keep, and the library would fail obscurely.
      aclrtContext context = nullptr;
      if (aclrtGetCurrentContext(&context) != ACL_SUCCESS || context == nullptr) {
        return fail(kHixlFailed, "no NPU context is current on the thread that creates the endpoint: select a device "
                                 "first (aclrtSetDevice, torch.npu.set_device) [" + acl_message() + "]");
      }
      std::map<vendor::AscendString, vendor::AscendString> vendor_opts;
      if (uint32_t s = vendor_options(options, vendor_opts); s != kHixlSuccess) return s;
      auto engine = std::make_unique<E>();
      const uint32_t s = engine->Initialize(vendor::AscendString(local_engine.c_str()), vendor_opts);
      if (s != kHixlSuccess) return fail(s, acl_message());
      context_ = context;
      engine_ = std::move(engine);
      return kHixlSuccess;
    });
  }

  void Finalize() override {
    if (!engine_) return;
    try {
      use_context();
      engine_->Finalize();
    } catch (...) {
      // Finalize has no status; the engine is dropped either way.
    }
    engine_.reset();
  }

  uint32_t RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle) override {
    return call([&]() -> uint32_t {
      vendor::MemDesc desc{};  // value-initialized: the reserved bytes must be zero
      desc.addr = mem.addr;
      desc.len = mem.len;
      vendor::MemHandle h = nullptr;
      const uint32_t s = engine_->RegisterMem(desc, type == MemType::kDevice ? vendor::MEM_DEVICE : vendor::MEM_HOST, h);
      if (s == kHixlSuccess) handle = h;
      return s;
    });
  }

  uint32_t DeregisterMem(MemHandle handle) override {
    return call([&] { return engine_->DeregisterMem(handle); });
  }

  uint32_t Connect(const std::string& remote_engine, int32_t timeout_ms) override {
    return call([&] { return engine_->Connect(vendor::AscendString(remote_engine.c_str()), timeout_ms); });
  }

  uint32_t Disconnect(const std::string& remote_engine, int32_t timeout_ms) override {
    return call([&] { return engine_->Disconnect(vendor::AscendString(remote_engine.c_str()), timeout_ms); });
  }

  uint32_t TransferSync(const std::string& remote_engine, TransferOp op, const std::vector<TransferOpDesc>& descs,
                        int32_t timeout_ms) override {
    return call([&] {
      return engine_->TransferSync(vendor::AscendString(remote_engine.c_str()), vendor_op(op), vendor_descs(descs),
                                   timeout_ms);
    });
  }

  uint32_t TransferAsync(const std::string& remote_engine, TransferOp op, const std::vector<TransferOpDesc>& descs,
                         TransferReq& req) override {
    if constexpr (HasTransferAsync<E>) {
      return call([&]() -> uint32_t {
        using Args = Param<E, &E::TransferAsync, 3>;
        const Args args{};  // reserved (and user_data, in newer headers): zero
        void* r = nullptr;  // TransferReq, a void* in every header that has it
        const uint32_t s =
            engine_->TransferAsync(vendor::AscendString(remote_engine.c_str()), vendor_op(op), vendor_descs(descs), args, r);
        if (s == kHixlSuccess) req = r;
        return s;
      });
    } else {
      return fail(kHixlUnsupported, "this build's " DLSLIME_FLAVOUR_NAME " headers have no TransferAsync");
    }
  }

  uint32_t GetTransferStatus(TransferReq req, TransferStatus& status) override {
    if constexpr (HasTransferAsync<E>) {
      return call([&]() -> uint32_t {
        using VendorStatus = decltype(status_out<E>(&E::GetTransferStatus));
        VendorStatus out = VendorStatus::WAITING;
        void* const r = req;
        const uint32_t s = engine_->GetTransferStatus(r, out);
        if (s != kHixlSuccess) return s;
        switch (out) {
          case VendorStatus::WAITING: status = TransferStatus::kWaiting; break;
          case VendorStatus::COMPLETED: status = TransferStatus::kCompleted; break;
          case VendorStatus::TIMEOUT: status = TransferStatus::kTimeout; break;
          default: status = TransferStatus::kFailed; break;
        }
        return kHixlSuccess;
      });
    } else {
      return fail(kHixlUnsupported, "this build's " DLSLIME_FLAVOUR_NAME " headers have no GetTransferStatus");
    }
  }

  uint32_t SendNotify(const std::string& remote_engine, const NotifyDesc& notify, int32_t timeout_ms) override {
    if constexpr (HasNotify<E>) {
      return call([&] {
        using VendorNotify = Param<E, &E::SendNotify, 1>;
        using Text = decltype(VendorNotify::name);  // ge::AscendString; dependent, like every
                                                     // name in this branch, so old headers build
        VendorNotify n;
        // (pointer, length): a payload may hold NUL bytes, which the one-argument form cuts at.
        n.name = Text(notify.name.c_str(), notify.name.size());
        n.notify_msg = Text(notify.notify_msg.c_str(), notify.notify_msg.size());
        return engine_->SendNotify(vendor::AscendString(remote_engine.c_str()), n, timeout_ms);
      });
    } else {
      return fail(kHixlUnsupported, "this build's " DLSLIME_FLAVOUR_NAME " headers have no SendNotify");
    }
  }

  uint32_t GetNotifies(std::vector<NotifyDesc>& notifies) override {
    if constexpr (HasNotify<E>) {
      return call([&]() -> uint32_t {
        using VendorNotifies = Param<E, &E::GetNotifies, 0>;
        VendorNotifies got;
        const uint32_t s = engine_->GetNotifies(got);
        if (s != kHixlSuccess) return s;
        notifies.clear();
        notifies.reserve(got.size());
        for (const auto& n : got) notifies.push_back({text(n.name), text(n.notify_msg)});
        return kHixlSuccess;
      });
    } else {
      return fail(kHixlUnsupported, "this build's " DLSLIME_FLAVOUR_NAME " headers have no GetNotifies");
    }
  }

  Capability GetCapability() const override { return {HasTransferAsync<E>, HasNotify<E>}; }

 private:
  // Runs fn with the context of Initialize current, and turns exceptions into FAILED.
  template <class Fn>
  uint32_t call(Fn&& fn) {
    if (!engine_) return fail(kHixlParamInvalid, "the engine is not initialized (or was finalized)");
    return guarded([&]() -> uint32_t {
      if (!use_context()) {
        return fail(kHixlFailed, "aclrtSetCurrentContext failed on this thread [" + acl_message() + "]");
      }
      const uint32_t s = fn();
      if (s != kHixlSuccess && t_last_error.empty()) t_last_error = acl_message();
      return s;
    });
  }

  template <class Fn>
  uint32_t guarded(Fn&& fn) {
    t_last_error.clear();
    try {
      return fn();
    } catch (const std::exception& e) {
      return fail(kHixlFailed, std::string("the library threw: ") + e.what());
    } catch (...) {
      return fail(kHixlFailed, "the library threw an unknown exception");
    }
  }

  // aclrtSetCurrentContext is per thread; a thread that already has this engine's context
  // (the common case: the transport's own threads) skips the call.
  bool use_context() {
    thread_local aclrtContext t_current = nullptr;
    if (t_current == context_) return true;
    if (aclrtSetCurrentContext(context_) != ACL_SUCCESS) return false;
    t_current = context_;
    return true;
  }

  std::unique_ptr<E> engine_;
  aclrtContext context_ = nullptr;
};

const char* last_error() { return t_last_error.c_str(); }

std::string describe_build() {
  std::string s = "CANN " DLSLIME_FLAVOUR_NAME " (" DLSLIME_FLAVOUR_LIBRARY "), headers ";
  s += HasTransferAsync<VendorEngine> ? "with" : "without";
  s += " TransferAsync, ";
  s += HasNotify<VendorEngine> ? "with" : "without";
  s += " notifies";
  return s;
}

}  // namespace
}  // namespace dlslime::ascend

extern "C" __attribute__((visibility("default"))) const dlslime::ascend::HixlPluginInfo*
dlslime_ascend_hixl_plugin_info() {
  using namespace dlslime::ascend;
  static const std::string built_with = describe_build();
  static const HixlPluginInfo info{kHixlPluginAbi, kStringAbi, static_cast<uint32_t>(sizeof(std::string)),
                                   DLSLIME_FLAVOUR_NAME, built_with.c_str(), &last_error};
  return &info;
}

extern "C" __attribute__((visibility("default"))) dlslime::ascend::HixlEngine* dlslime_ascend_hixl_plugin_create() {
  using namespace dlslime::ascend;
  try {
    return new LibraryEngine<VendorEngine>();
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return nullptr;
  }
}

// The entry points must match the types the loader resolves them as.
static_assert(std::is_same_v<decltype(dlslime_ascend_hixl_plugin_info), dlslime::ascend::HixlPluginInfoFn>);
static_assert(std::is_same_v<decltype(dlslime_ascend_hixl_plugin_create), dlslime::ascend::HixlPluginCreateFn>);
