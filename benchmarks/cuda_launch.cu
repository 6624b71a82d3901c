// The CUDA C reference for `gputrace calibrate --backend cuda`: the same measurements, made
// without Python, so the two tables can be read side by side (benchmarks/run_calibrate_h200.sh).
//
//   nvcc -O2 -o cuda_launch benchmarks/cuda_launch.cu && ./cuda_launch [--quick]
//
// Each line printed: key, what, then median/p5/p95/n of the wall clock (CPU, steady_clock) and of
// the device clock (cudaEvent pairs), in ns ("-" where not measured). Keys match the JSON keys of
// `gputrace calibrate`. As there, a batch of launches is queued behind a kernel that spins on
// %globaltimer, so the GPU runs the batch back to back and its per-kernel cost is what is timed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(call)                                                                    \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                \
                   cudaGetErrorString(err_));                                          \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__global__ void gt_empty() {}

__global__ void gt_spin(long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while ((long long)(t - t0) < ns);
}

static double now_ns() {
  return (double)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Stat {
  double median = 0, p5 = 0, p95 = 0;
  size_t n = 0;
};

static double pct(std::vector<double> v, double q) {  // linear interpolation, as numpy does
  std::sort(v.begin(), v.end());
  double pos = q / 100.0 * (double)(v.size() - 1);
  size_t lo = (size_t)pos;
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

static Stat stat(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  s.median = pct(v, 50);
  s.p5 = pct(v, 5);
  s.p95 = pct(v, 95);
  s.n = v.size();
  return s;
}

static void row(const std::string& key, const std::string& what, const std::vector<double>& wall,
                const std::vector<double>& dev) {
  Stat w = stat(wall), d = stat(dev);
  std::printf("%s\t%s", key.c_str(), what.c_str());
  if (w.n) std::printf("\t%.1f\t%.1f\t%.1f\t%zu", w.median, w.p5, w.p95, w.n);
  else std::printf("\t-\t-\t-\t0");
  if (d.n) std::printf("\t%.1f\t%.1f\t%.1f\t%zu\n", d.median, d.p5, d.p95, d.n);
  else std::printf("\t-\t-\t-\t0\n");
  std::fflush(stdout);
}

static cudaStream_t stream;
static cudaEvent_t ev0, ev1;

static double elapsed_ns() {
  CHECK(cudaEventSynchronize(ev1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
  return (double)ms * 1e6;
}

// (CPU ns per launch, GPU ns per launch) over `per` launches of `blocks` x 256 (or 1 x 1) queued
// behind a spin kernel.
static void queued_batches(int blocks, int threads, int per, int batches, std::vector<double>& cpu,
                           std::vector<double>& gpu) {
  for (int i = 0; i < 20; ++i) gt_empty<<<blocks, threads, 0, stream>>>();
  double t0 = now_ns();
  for (int i = 0; i < per; ++i) gt_empty<<<blocks, threads, 0, stream>>>();
  double enqueue = now_ns() - t0;
  CHECK(cudaStreamSynchronize(stream));
  long long spin = (long long)(3.0 * enqueue + 200000.0);
  for (int b = 0; b < batches; ++b) {
    gt_spin<<<1, 1, 0, stream>>>(spin);
    CHECK(cudaEventRecord(ev0, stream));
    double a = now_ns();
    for (int i = 0; i < per; ++i) gt_empty<<<blocks, threads, 0, stream>>>();
    double z = now_ns();
    CHECK(cudaEventRecord(ev1, stream));
    cpu.push_back((z - a) / per);
    gpu.push_back(elapsed_ns() / per);
  }
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int batches = quick ? 20 : 100;

  // first use: this process is fresh, so the first runtime call creates the context
  double t0 = now_ns();
  CHECK(cudaFree(0));
  double t1 = now_ns();
  gt_empty<<<1, 1>>>();
  CHECK(cudaDeviceSynchronize());
  double t2 = now_ns();
  gt_empty<<<1, 1>>>();
  CHECK(cudaDeviceSynchronize());
  double t3 = now_ns();
  row("first_context", "CUDA context creation (cudaFree(0))", {t1 - t0}, {});
  row("first_first_launch", "first launch + sync (module loaded lazily)", {t2 - t1}, {});
  row("first_second_launch", "second launch + sync", {t3 - t2}, {});

  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaEventCreate(&ev0));
  CHECK(cudaEventCreate(&ev1));
  for (int i = 0; i < 2000; ++i) gt_empty<<<1, 1, 0, stream>>>();
  CHECK(cudaStreamSynchronize(stream));

  {
    std::vector<double> cpu, gpu;
    queued_batches(1, 1, 100, batches, cpu, gpu);
    row("launch", "empty kernel launch, queued", cpu, gpu);
  }
  {
    std::vector<double> wall, dev;
    for (int i = 0; i < batches * 5; ++i) {
      double a = now_ns();
      gt_empty<<<1, 1, 0, stream>>>();
      CHECK(cudaStreamSynchronize(stream));
      wall.push_back(now_ns() - a);
    }
    for (int i = 0; i < batches * 5; ++i) {
      CHECK(cudaEventRecord(ev0, stream));
      gt_empty<<<1, 1, 0, stream>>>();
      CHECK(cudaEventRecord(ev1, stream));
      dev.push_back(elapsed_ns());
    }
    row("launch_sync", "one empty launch + wait (idle GPU)", wall, dev);
  }
  for (int blocks : {1, 16, 256, 1024, 4096, 16384}) {
    std::vector<double> cpu, gpu;
    queued_batches(blocks, 256, 50, std::max(5, batches / 4), cpu, gpu);
    row("grid_" + std::to_string(blocks),
        "empty kernel, " + std::to_string(blocks) + " blocks x 256 threads, queued", cpu, gpu);
  }
  {
    const int kernels = 100;
    cudaStream_t gs;
    CHECK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(gs, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < kernels; ++i) gt_empty<<<1, 1, 0, gs>>>();
    CHECK(cudaStreamEndCapture(gs, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 20; ++i) CHECK(cudaGraphLaunch(exec, gs));
    CHECK(cudaStreamSynchronize(gs));
    std::vector<double> cpu, cpu_per, gpu;
    for (int b = 0; b < batches; ++b) {
      gt_spin<<<1, 1, 0, gs>>>(200000);
      CHECK(cudaEventRecord(ev0, gs));
      double a = now_ns();
      CHECK(cudaGraphLaunch(exec, gs));
      double z = now_ns();
      CHECK(cudaEventRecord(ev1, gs));
      cpu.push_back(z - a);
      cpu_per.push_back((z - a) / kernels);
      gpu.push_back(elapsed_ns() / kernels);
    }
    row("graph_launch", "graph of 100 empty kernels: replay", cpu, {});
    row("graph_kernel", "graph replay, per kernel", cpu_per, gpu);
  }
  {
    std::vector<double> rec, pair;
    for (int i = 0; i < batches * 5; ++i) {
      CHECK(cudaEventRecord(ev0, stream));
      CHECK(cudaEventRecord(ev1, stream));
      pair.push_back(elapsed_ns());
    }
    for (int b = 0; b < batches; ++b) {
      double a = now_ns();
      for (int i = 0; i < 100; ++i) CHECK(cudaEventRecord(ev0, stream));
      rec.push_back((now_ns() - a) / 100);
    }
    CHECK(cudaStreamSynchronize(stream));
    row("event_pair", "event pair with nothing between", rec, pair);
  }
  size_t large = (size_t)(quick ? 64 : 256) << 20;
  for (size_t nbytes : {(size_t)1024, large}) {
    void* dev;
    CHECK(cudaMalloc(&dev, nbytes));
    void* pageable = std::malloc(nbytes);
    std::memset(pageable, 1, nbytes);
    void* pinned;
    CHECK(cudaMallocHost(&pinned, nbytes));
    std::memset(pinned, 1, nbytes);
    int reps = nbytes <= (1 << 20) ? batches * 5 : (quick ? 5 : 20);
    std::string size = nbytes == 1024 ? "1 KB" : std::to_string(nbytes >> 20) + " MB";
    std::string tag = nbytes == 1024 ? "1k" : "large";
    for (int m = 0; m < 2; ++m) {
      void* host = m == 0 ? pageable : pinned;
      std::string memory = m == 0 ? "pageable" : "pinned";
      for (int d = 0; d < 2; ++d) {
        cudaMemcpyKind kind = d == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
        void* dst = d == 0 ? dev : host;
        const void* src = d == 0 ? host : dev;
        CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
        CHECK(cudaStreamSynchronize(stream));
        std::vector<double> wall, devt;
        for (int i = 0; i < reps; ++i) {
          double a = now_ns();
          CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
          CHECK(cudaStreamSynchronize(stream));
          wall.push_back(now_ns() - a);
        }
        for (int i = 0; i < reps; ++i) {
          CHECK(cudaEventRecord(ev0, stream));
          CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
          CHECK(cudaEventRecord(ev1, stream));
          devt.push_back(elapsed_ns());
        }
        std::string dir = d == 0 ? "H2D" : "D2H";
        std::string key = std::string(d == 0 ? "h2d" : "d2h") + "_" + tag + "_" + memory;
        row(key, dir + " " + size + ", " + memory + " host memory", wall, devt);
      }
    }
    CHECK(cudaFree(dev));
    CHECK(cudaFreeHost(pinned));
    std::free(pageable);
  }
  return 0;
}
