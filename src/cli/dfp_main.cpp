// dfp command-line program. Subcommands:
//   dfp info [--threads N] [--isa LEVEL]   CPU features, the kernel chosen per op, versions
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"

namespace {

struct Args {
  std::vector<std::string> items;
  size_t pos = 0;
  bool next(std::string& out) {
    if (pos >= items.size()) return false;
    out = items[pos++];
    return true;
  }
  std::string value(const std::string& flag) {
    DFP_CHECK(pos < items.size(), dfp::Status::invalid_argument, "flag " + flag + " expects a value");
    return items[pos++];
  }
};

int to_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const int x = std::stoi(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  dfp::fail(dfp::Status::invalid_argument, "flag " + flag + ": expected an integer, got '" + v + "'");
}

int cmd_info(Args& args) {
  dfp::ContextOptions opt;
  std::string a;
  while (args.next(a)) {
    if (a == "--threads") opt.threads = to_int(a, args.value(a));
    else if (a == "--isa") opt.isa = args.value(a);
    else dfp::fail(dfp::Status::invalid_argument, "dfp info: unknown flag '" + a + "' (known: --threads, --isa)");
  }
  dfp::Context ctx(opt);
  const dfp::CpuFeatures& f = ctx.cpu();
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  std::printf("dfp %s\n", DFP_VERSION);
  std::printf("cpu            %s (%s)\n", f.brand.c_str(), f.vendor.c_str());
  std::printf("features       avx2=%s fma=%s f16c=%s avx512f=%s avx512bw=%s avx512dq=%s avx512vl=%s\n", yn(f.avx2),
              yn(f.fma), yn(f.f16c), yn(f.avx512f), yn(f.avx512bw), yn(f.avx512dq), yn(f.avx512vl));
  std::printf("               avx512_vnni=%s avx512_bf16=%s avx512_fp16=%s os_zmm_state=%s\n", yn(f.avx512vnni),
              yn(f.avx512bf16), yn(f.avx512fp16), yn(f.os_saves_zmm));
  std::printf("kernel level   %s (best supported: %s; force with DFP_ISA=ref|avx512bw|avx512vnni)\n",
              dfp::isa_name(ctx.isa()), dfp::isa_name(f.best()));
  std::printf("threads        %d (oneTBB arena and OpenMP for oneDNN)\n", ctx.threads());
  const auto& k = ctx.kernels();
  std::printf("\nop / precision                      kernel\n");
  std::printf("max|x| (dfp16 exponent)      f32    %s\n", k.max_abs.name);
  std::printf("quantize                     dfp16  %s\n", k.quantize.name);
  std::printf("dequantize                   dfp16  %s\n", k.dequantize.name);
  std::printf("batch-pair layout            dfp16  %s\n", k.interleave.name);
  std::printf("conv fwd / bwd_data, linear  int16  %s\n", k.conv_s16_pixel.name);
  std::printf("conv bwd_weights, linear dW  int16  %s\n", k.conv_s16_pair.name);
  dfp::ConvShape probe;
  probe.N = 2; probe.C = 16; probe.H = 8; probe.W = 8; probe.K = 16; probe.R = 3; probe.S = 3; probe.pad_h = 1; probe.pad_w = 1;
  dfp::ConvF32 f32(ctx, probe, "probe");
  std::printf("conv all passes              fp32   %s\n", f32.kernel_name());
  const dnnl_version_t* v = dnnl_version();
  std::printf("\nlibraries      oneDNN %d.%d.%d (%s runtime)\n", v->major, v->minor, v->patch,
              v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other");
  return 0;
}

void usage() {
  std::puts(
      "usage: dfp <command> [flags]\n"
      "commands:\n"
      "  info     CPU features, kernels chosen per op and precision, library versions\n"
      "           flags: --threads N, --isa ref|avx512bw|avx512vnni");
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) args.items.emplace_back(argv[i]);
  std::string cmd;
  if (!args.next(cmd) || cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage();
    return cmd.empty() ? 2 : 0;
  }
  try {
    if (cmd == "info") return cmd_info(args);
    std::fprintf(stderr, "dfp: unknown command '%s'\n", cmd.c_str());
    usage();
    return 2;
  } catch (const dfp::Error& e) {
    std::fprintf(stderr, "dfp %s: %s: %s\n", cmd.c_str(), dfp::status_name(e.status()), e.what());
    return 1;
  }
}
