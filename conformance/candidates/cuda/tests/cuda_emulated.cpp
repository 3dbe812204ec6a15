// The device layer of builtin:cuda (cuda_norm.hpp) implemented by running the real kernels of
// cuda_norm_device.cuh on the CPU emulator (cuda_emulator.hpp). Linked with cuda_plugin.cpp into
// a test-only plugin, so that the ctest conformance.cuda.emulated checks the CUDA kernels against
// the certified reference on machines without a GPU. Pointers go straight to the host buffers.
#include "cuda_emulator.hpp"  // first: defines the CUDA names the kernels use

#include <string>
#include <vector>

#include "../cuda_norm.hpp"
#include "../cuda_norm_device.cuh"
#include "../cuda_quant_device.cuh"

namespace normcheck::cuda_candidate {

struct Device {};

Device* open_device(std::string&) { return new Device; }
void close_device(Device* d) { delete d; }
std::string device_name(const Device*) { return "CPU emulator of the CUDA kernels"; }

// Every thread of every block is a fiber with a few dozen switches: 65537 rows x 32 threads took
// 47 s (LayerNorm forward) to 94 s (backward) here, so cases past 2^18 thread-rows (a few
// seconds) are declined; the rest of the ci tier then runs in about 25 s.
std::string declines(const Device*, std::int64_t rows, std::int64_t cols) {
  constexpr std::int64_t kLimit = std::int64_t{1} << 18;
  if (rows * device::row_threads(cols) > kLimit)
    return "too large for the CPU emulator of the CUDA kernels (rows x threads > 2^18)";
  return {};
}

namespace {

template <class T>
void launch(const Problem& p, const device::Args& a) {
  const auto rows = static_cast<unsigned>(p.rows);
  const auto threads = static_cast<unsigned>(device::row_threads(p.cols));
  if (p.backward)
    emu::launch(rows, threads, [&a] { device::norm_backward_rows<T>(a); });
  else
    emu::launch(rows, threads, [&a] { device::norm_forward<T>(a); });
  if (p.backward && (a.dw || a.db || a.drb))
    emu::launch(static_cast<unsigned>((p.cols + 255) / 256), 256, [&a] { device::norm_backward_cols<T>(a); });
}

}  // namespace

std::string run_problem(Device*, const Problem& p) {
  const auto count = static_cast<std::size_t>(p.rows * p.cols);
  const std::size_t compute_size = p.compute == NC_FLOAT64 ? 8 : 4;
  std::vector<unsigned char> xhat, dh;
  device::Args a{};
  a.x = p.x.data, a.x_dt = p.x.dtype;
  a.res = p.residual.data, a.res_dt = p.residual.dtype;
  a.rbias = p.residual_bias.data, a.rbias_dt = p.residual_bias.dtype;
  a.w = p.weight.data, a.w_dt = p.weight.dtype;
  a.b = p.bias.data, a.b_dt = p.bias.dtype;
  a.dy = p.dy.data, a.dy_dt = p.dy.dtype;
  a.y = p.y.data, a.y_dt = p.y.dtype;
  a.h_out = p.residual_out.data, a.h_dt = p.residual_out.dtype;
  a.mean = p.mean.data;
  a.rstd = p.rstd.data;
  a.dx = p.dx.data, a.dx_dt = p.dx.dtype;
  a.dres = p.dresidual.data, a.dres_dt = p.dresidual.dtype;
  a.dw = p.dweight.data, a.dw_dt = p.dweight.dtype;
  a.db = p.dbias.data, a.db_dt = p.dbias.dtype;
  a.drb = p.dresidual_bias.data, a.drb_dt = p.dresidual_bias.dtype;
  if (p.backward && p.dweight.data) {
    xhat.resize(count * compute_size);
    a.xhat = xhat.data();
  }
  if (p.backward && p.dresidual_bias.data) {
    dh.resize(count * compute_size);
    a.dh = dh.data();
  }
  if (!p.x.data) return "the case has no input x";
  if (p.backward && !p.dy.data) return "a backward case without input dy";
  device::set_scalars(a, p);
  if (p.quant.on) {
    device::QuantArgs qa{};
    qa.q = p.quant.q.data;
    qa.scale = p.quant.scale.data;
    qa.row_amax = p.quant.row_amax.data;
    device::set_contract(qa, p.quant);
    emu::launch(static_cast<unsigned>(p.rows), static_cast<unsigned>(device::row_threads(p.cols)),
                [&a, &qa] { device::rms_norm_quant(a, qa); });
    return {};
  }
  if (p.compute == NC_FLOAT64)
    launch<double>(p, a);
  else
    launch<float>(p, a);
  return {};
}

}  // namespace normcheck::cuda_candidate
