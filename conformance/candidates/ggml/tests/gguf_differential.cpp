// ggml's own GGUF parser (libggml-base's gguf_init_from_buffer) as a second opinion on the
// audit's GGUF reader (conformance/audit/src/gguf.cpp): over every file given (files, or
// folders read recursively), both must agree on whether the file is well formed and, where both
// read it, on every tensor's name, ggml type, shape and file offset, in order.
//
// usage: ggml_gguf_differential [--known FILE.json] [--verbose] PATH...
//
// ggml's parser runs in a child process per file, under a 4 GiB address-space limit and a
// 20-second alarm, so that a crash, a hang or an unbounded allocation in it on a hostile file is
// recorded (as a finding for ggml) and the run goes on. A disagreement is printed with both
// answers; `--known` lists the kinds of disagreement already resolved (kind, a text the detail
// contains, which side is right and why): the exit status is 0 when every disagreement is of
// a known kind, 1 otherwise, 2 on a usage error. A known kind that no file shows any more fails
// the run too, so the list cannot go stale.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ggml.h"
#include "gguf.h"
#include "normcheck/audit/checkpoint.hpp"

namespace fs = std::filesystem;
namespace audit = normcheck::audit;

namespace {

// What one parser says of one file.
struct Answer {
  bool read = false;     // well formed
  std::string problem;   // why not (the audit's message, ggml's log line, or how the child died)
  bool died = false;     // ggml's child crashed, hung or ran out of its memory limit
  nlohmann::json tensors = nlohmann::json::array();  // [{name, type, shape, offset}]
};

// Tensor names are bytes (a hostile file's need not be UTF-8): kept as hex in the JSON.
std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// A name for a message: printable ASCII as is, any other byte as \xHH.
std::string printable(const std::string& hex_name) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex_name.size(); i += 2) {
    const int c = std::stoi(hex_name.substr(i, 2), nullptr, 16);
    if (c >= 32 && c < 127 && c != '\\') out += static_cast<char>(c);
    else out += "\\x" + hex_name.substr(i, 2);
  }
  return out;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

Answer audit_answer(const std::vector<std::uint8_t>& bytes, const std::string& name) {
  Answer a;
  try {
    const auto c = audit::parse_gguf(bytes.data(), bytes.size(), name);
    a.read = true;
    for (const auto& t : c->tensors()) {
      // Leading 1s dropped (GGUF's trailing ne 1s), as on ggml's side, which cannot tell them.
      std::vector<std::uint64_t> shape(std::find_if(t.shape.begin(), t.shape.end(), [](auto d) { return d != 1; }), t.shape.end());
      a.tensors.push_back({{"name", hex(t.stored_name)}, {"type", lower(t.dtype)}, {"shape", shape}, {"offset", t.offset}});
    }
  } catch (const audit::CheckpointError& e) {
    a.problem = e.what();
  }
  return a;
}

// In the child: parse with ggml and write the answer as JSON to `fd`.
[[noreturn]] void ggml_child(const std::vector<std::uint8_t>& bytes, int fd, int err_fd) {
  dup2(err_fd, STDERR_FILENO);
  setenv("GGML_NO_BACKTRACE", "1", 1);  // ggml's abort handler would attach gdb to print one
#ifndef __SANITIZE_ADDRESS__  // AddressSanitizer's shadow memory is terabytes of address space
  rlimit limit{4ull << 30, 4ull << 30};
  setrlimit(RLIMIT_AS, &limit);
#endif
  alarm(20);
  gguf_init_params params{true, nullptr};  // no_alloc: the tensor infos only
  gguf_context* ctx = gguf_init_from_buffer(bytes.data(), bytes.size(), params);
  nlohmann::json out = {{"read", ctx != nullptr}, {"tensors", nlohmann::json::array()}};
  if (ctx) {
    const std::size_t data = gguf_get_data_offset(ctx);
    for (std::int64_t i = 0; i < gguf_get_n_tensors(ctx); ++i) {
      const std::int64_t* ne = gguf_get_tensor_ne(ctx, i);
      // ggml gives GGML_MAX_DIMS extents, 1 past the tensor's rank, and no rank: the shapes are
      // compared with trailing 1s of ne dropped on both sides.
      int rank = GGML_MAX_DIMS;
      while (rank > 0 && ne[rank - 1] == 1) --rank;
      std::vector<std::uint64_t> shape;
      for (int d = rank - 1; d >= 0; --d) shape.push_back(static_cast<std::uint64_t>(ne[d]));
      out["tensors"].push_back({{"name", hex(gguf_get_tensor_name(ctx, i))},
                                {"type", lower(ggml_type_name(gguf_get_tensor_type(ctx, i)))},
                                {"shape", shape},
                                {"offset", data + gguf_get_tensor_offset(ctx, i)}});
    }
    gguf_free(ctx);
  }
  const std::string text = out.dump();
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t k = write(fd, text.data() + done, text.size() - done);
    if (k <= 0) _exit(3);
    done += static_cast<std::size_t>(k);
  }
  _exit(0);
}

// ggml's log lines joined: the first says what, the last that the parse failed.
std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '\n' ? ';' : c;
  while (!out.empty() && (out.back() == ';' || out.back() == ' ')) out.pop_back();
  return out;
}

Answer ggml_answer(const std::vector<std::uint8_t>& bytes) {
  Answer a;
  int p[2];
  FILE* err = std::tmpfile();
  if (pipe(p) != 0 || !err) throw std::runtime_error(std::string("pipe/tmpfile: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    close(p[0]);
    ggml_child(bytes, p[1], fileno(err));
  }
  close(p[1]);
  std::string text;
  char buf[65536];
  for (ssize_t k; (k = read(p[0], buf, sizeof buf)) != 0;) {
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) break;
    text.append(buf, static_cast<std::size_t>(k));
  }
  close(p[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string log;
  std::rewind(err);
  for (std::size_t k; (k = std::fread(buf, 1, sizeof buf, err)) > 0;) log.append(buf, k);
  std::fclose(err);
  if (WIFSIGNALED(status) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    a.died = true;
    a.problem = WIFSIGNALED(status) ? std::string("ggml's parser died: signal ") + strsignal(WTERMSIG(status))
                                    : "ggml's parser exited " + std::to_string(WEXITSTATUS(status));
    if (!log.empty()) a.problem += " (" + one_line(log) + ")";
    return a;
  }
  const auto j = nlohmann::json::parse(text);
  a.read = j.at("read").get<bool>();
  a.tensors = j.at("tensors");
  if (!a.read) a.problem = log.empty() ? "rejected" : one_line(log);
  return a;
}

// The kind of a disagreement, or "" where the two agree.
std::string compare(const Answer& ours, const Answer& ggml, std::string& detail) {
  if (ggml.died) {
    detail = ggml.problem;
    return "ggml_died";
  }
  if (ours.read != ggml.read) {
    detail = ours.read ? "ggml rejects it: " + ggml.problem : "the audit rejects it: " + ours.problem;
    return ours.read ? "only_audit_reads" : "only_ggml_reads";
  }
  if (!ours.read) return "";
  if (ours.tensors.size() != ggml.tensors.size()) {
    detail = "tensor count: audit " + std::to_string(ours.tensors.size()) + ", ggml " + std::to_string(ggml.tensors.size());
    return "tensors_differ";
  }
  for (std::size_t i = 0; i < ours.tensors.size(); ++i)
    for (const char* field : {"name", "type", "shape", "offset"})
      if (ours.tensors[i][field] != ggml.tensors[i][field]) {
        const bool name = std::string(field) == "name";
        const auto show = [&](const nlohmann::json& v) { return name ? "\"" + printable(v.get<std::string>()) + "\"" : v.dump(); };
        detail = "tensor " + std::to_string(i) + " " + field + ": audit " + show(ours.tensors[i][field]) + ", ggml " +
                 show(ggml.tensors[i][field]);
        return "tensors_differ";
      }
  return "";
}

void collect(const fs::path& p, std::vector<fs::path>& out) {
  if (fs::is_directory(p)) {
    for (const auto& e : fs::recursive_directory_iterator(p))
      if (e.is_regular_file()) out.push_back(e.path());
  } else if (fs::is_regular_file(p)) {
    out.push_back(p);
  } else {
    throw std::invalid_argument(p.string() + ": no such file or folder");
  }
}

std::vector<std::uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error(p.string() + ": cannot be read");
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

int usage(const std::string& why) {
  std::cerr << "ggml_gguf_differential: " << why << "\nusage: ggml_gguf_differential [--known FILE.json] [--verbose] PATH...\n";
  return 2;
}

}  // namespace

// A known kind of disagreement: its kind, a text its detail contains, which side is right and
// why (gguf_known_disagreements.json).
struct Known {
  std::string kind, detail, right, why;
  int seen = 0;
};

int main(int argc, char** argv) {
  std::vector<fs::path> files;
  std::vector<Known> known;
  bool verbose = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--verbose") {
        verbose = true;
      } else if (a == "--known") {
        if (++i == argc) return usage("--known needs a file");
        std::ifstream f(argv[i]);
        if (!f) return usage(std::string(argv[i]) + ": cannot be read");
        const auto list = nlohmann::json::parse(f);  // kept: a range over a temporary's member dangles
        for (const auto& k : list.at("disagreements")) {
          known.push_back({k.at("kind"), k.at("detail"), k.at("right"), k.at("why"), 0});
        }
      } else if (a.starts_with("--")) {
        return usage("unknown option " + a);
      } else {
        collect(a, files);
      }
    }
  } catch (const std::exception& e) {
    return usage(e.what());
  }
  if (files.empty()) return usage("no files");
  std::sort(files.begin(), files.end());

  int both_read = 0, both_rejected = 0, unexplained = 0, explained = 0;
  for (const auto& path : files) {
    const std::string name = path.filename().string();
    const auto bytes = slurp(path);
    const Answer ours = audit_answer(bytes, name);
    const Answer ggml = ggml_answer(bytes);
    std::string detail;
    const std::string kind = compare(ours, ggml, detail);
    if (kind.empty()) {
      (ours.read ? both_read : both_rejected) += 1;
      if (verbose)
        std::cout << "agree    " << name << (ours.read ? ": read, " + std::to_string(ours.tensors.size()) + " tensors" : ": rejected") << "\n";
      continue;
    }
    const auto k = std::find_if(known.begin(), known.end(),
                                [&](const Known& x) { return x.kind == kind && detail.find(x.detail) != std::string::npos; });
    if (k != known.end()) {
      ++explained;
      ++k->seen;
      if (verbose) std::cout << "known    " << name << ": " << kind << ": " << detail << "\n";
    } else {
      ++unexplained;
      std::cout << "DISAGREE " << name << ": " << kind << ": " << detail << "\n";
    }
  }
  for (const auto& k : known) {
    if (k.seen == 0) {
      std::cout << "STALE    known " << k.kind << " \"" << k.detail << "\": no file disagrees so any more\n";
      ++unexplained;
    } else {
      std::cout << "known    " << k.seen << " x " << k.kind << " \"" << k.detail << "\": " << k.right << " is right: " << k.why << "\n";
    }
  }
  std::cout << files.size() << " GGUF files: both read " << both_read << ", both rejected " << both_rejected
            << ", known disagreements " << explained << ", unexplained " << unexplained << "\n";
  return unexplained == 0 ? 0 : 1;
}
