#include "server/auth.h"

#include <glog/logging.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace matmul::server {
namespace {

int64_t ModificationTimeNs(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

absl::Status Unauthenticated() {
  return absl::UnauthenticatedError("missing or invalid bearer token");
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walk b in full; fold in a length mismatch.
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = a.empty() ? 0 : static_cast<unsigned char>(a[i % a.size()]);
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

absl::StatusOr<std::vector<TokenAuthenticator::Entry>> TokenAuthenticator::Read(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::vector<Entry> entries;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || absl::StartsWith(text, "#")) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    ++n;
    if (parts.size() == 1) {
      entries.push_back({absl::StrCat("client-", n), std::string(parts[0])});
    } else if (parts.size() == 2) {
      entries.push_back({std::string(parts[0]), std::string(parts[1])});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": line ", n, " is not \"NAME TOKEN\" or \"TOKEN\""));
    }
    if (entries.back().token.size() < 16) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": token of ", entries.back().name, " is shorter than 16 characters"));
    }
  }
  if (entries.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no token"));
  return entries;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Create(
    const std::string& path, absl::Duration poll) {
  std::unique_ptr<TokenAuthenticator> auth(new TokenAuthenticator(path));
  if (absl::Status s = auth->Reload(); !s.ok()) return s;
  if (poll > absl::ZeroDuration()) {
    auth->watcher_ = std::thread([raw = auth.get(), poll] { raw->Watch(poll); });
  }
  return auth;
}

TokenAuthenticator::~TokenAuthenticator() {
  stop_.Notify();
  if (watcher_.joinable()) watcher_.join();
}

absl::Status TokenAuthenticator::Reload() {
  const int64_t mtime = ModificationTimeNs(path_);
  absl::StatusOr<std::vector<Entry>> entries = Read(path_);
  if (!entries.ok()) return entries.status();
  absl::MutexLock lock(&mu_);
  entries_ = *std::move(entries);
  mtime_ns_ = mtime;
  LOG(INFO) << "authentication: " << entries_.size() << " token(s) loaded from " << path_;
  return absl::OkStatus();
}

void TokenAuthenticator::Watch(absl::Duration poll) {
  while (!stop_.WaitForNotificationWithTimeout(poll)) {
    int64_t seen;
    {
      absl::MutexLock lock(&mu_);
      seen = mtime_ns_;
    }
    const int64_t now = ModificationTimeNs(path_);
    if (now < 0 || now == seen) continue;
    if (absl::Status s = Reload(); !s.ok()) {
      LOG(WARNING) << "authentication: keeping the previous tokens: " << s.message();
      absl::MutexLock lock(&mu_);
      mtime_ns_ = now;  // Do not retry a broken file until it changes again.
    }
  }
}

size_t TokenAuthenticator::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

absl::StatusOr<std::string> TokenAuthenticator::AuthenticateToken(absl::string_view token) const {
  absl::MutexLock lock(&mu_);
  const std::string* match = nullptr;
  for (const Entry& e : entries_) {  // No early exit: the same work for every token.
    if (ConstantTimeEquals(e.token, token)) match = &e.name;
  }
  if (match == nullptr) return Unauthenticated();
  return *match;
}

absl::StatusOr<std::string> TokenAuthenticator::Authenticate(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return Unauthenticated();
  const absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (value.size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kBearer.size()), kBearer)) {
    return Unauthenticated();
  }
  return AuthenticateToken(value.substr(kBearer.size()));
}

}  // namespace matmul::server
