#include "server/jobs/job_store.h"

#include <sqlite3.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {
namespace {

// Bumped when the table changes; a store from a newer release is refused
// rather than misread.
constexpr int kSchemaVersion = 1;

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  ord INTEGER NOT NULL UNIQUE,
  request_id TEXT NOT NULL,
  state INTEGER NOT NULL,
  submitted_spec BLOB NOT NULL,
  job BLOB NOT NULL,
  last_seq INTEGER NOT NULL,
  failed_runs INTEGER NOT NULL,
  updated_unix_ms INTEGER NOT NULL
);
)sql";

// Finalizes a statement however the scope is left.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

std::string Blob(sqlite3_stmt* stmt, int column) {
  const void* data = sqlite3_column_blob(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  return data == nullptr ? std::string() : std::string(static_cast<const char*>(data), size);
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                                        SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string why = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("cannot open the job store ", path, ": ", why));
  }
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  sqlite3_busy_timeout(db, 5000);
  // WAL: a commit is one append and fsync; readers never block the writer.
  // synchronous=FULL: a commit survives a power cut, not just a crash.
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    if (absl::Status s = store->Exec(pragma); !s.ok()) return s;
  }
  Statement version(db, "PRAGMA user_version");
  if (!version.ok() || sqlite3_step(version.get()) != SQLITE_ROW) return store->Error("reading its version");
  const int found = sqlite3_column_int(version.get(), 0);
  if (found > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job store ", path, " has format ", found, ", newer than this ferryd's ", kSchemaVersion,
        "; run a newer ferryd, or give this one another --state_dir"));
  }
  if (absl::Status s = store->Exec(kSchema); !s.ok()) return s;
  if (absl::Status s = store->Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str()); !s.ok()) {
    return s;
  }
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Error(const std::string& what) const {
  return absl::FailedPreconditionError(
      absl::StrCat("job store ", path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status JobStore::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string why = message != nullptr ? message : sqlite3_errmsg(db_);
    sqlite3_free(message);
    return absl::FailedPreconditionError(absl::StrCat("job store ", path_, ": ", sql, ": ", why));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<JobStore::Row>> JobStore::LoadAll() {
  Statement stmt(db_, "SELECT id, ord, submitted_spec, job, last_seq, failed_runs FROM jobs ORDER BY ord");
  if (!stmt.ok()) return Error("reading the jobs");
  std::vector<Row> rows;
  int rc;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    Row row;
    const std::string id = reinterpret_cast<const char*>(sqlite3_column_text(stmt.get(), 0));
    row.order = static_cast<uint64_t>(sqlite3_column_int64(stmt.get(), 1));
    row.submitted_spec = Blob(stmt.get(), 2);
    if (!row.job.ParseFromString(Blob(stmt.get(), 3)) || row.job.id() != id) {
      return absl::DataLossError(absl::StrCat("job store ", path_, ": the record of job ", id,
                                              " is damaged; move the file aside to start afresh"));
    }
    row.last_seq = static_cast<uint64_t>(sqlite3_column_int64(stmt.get(), 4));
    row.failed_runs = static_cast<uint32_t>(sqlite3_column_int(stmt.get(), 5));
    rows.push_back(std::move(row));
  }
  if (rc != SQLITE_DONE) return Error("reading the jobs");
  return rows;
}

absl::Status JobStore::Put(const Row& row) {
  Statement stmt(db_,
                 "INSERT OR REPLACE INTO jobs (id, ord, request_id, state, submitted_spec, job, last_seq, "
                 "failed_runs, updated_unix_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
  if (!stmt.ok()) return Error("preparing a write");
  const std::string job = row.job.SerializeAsString();
  sqlite3_stmt* s = stmt.get();
  sqlite3_bind_text(s, 1, row.job.id().data(), static_cast<int>(row.job.id().size()), SQLITE_STATIC);
  sqlite3_bind_int64(s, 2, static_cast<sqlite3_int64>(row.order));
  sqlite3_bind_text(s, 3, row.job.request_id().data(), static_cast<int>(row.job.request_id().size()),
                    SQLITE_STATIC);
  sqlite3_bind_int(s, 4, row.job.state());
  sqlite3_bind_blob(s, 5, row.submitted_spec.data(), static_cast<int>(row.submitted_spec.size()), SQLITE_STATIC);
  sqlite3_bind_blob(s, 6, job.data(), static_cast<int>(job.size()), SQLITE_STATIC);
  sqlite3_bind_int64(s, 7, static_cast<sqlite3_int64>(row.last_seq));
  sqlite3_bind_int(s, 8, static_cast<int>(row.failed_runs));
  sqlite3_bind_int64(s, 9, absl::ToUnixMillis(absl::Now()));
  if (sqlite3_step(s) != SQLITE_DONE) return Error(absl::StrCat("writing job ", row.job.id()));
  return absl::OkStatus();
}

absl::Status JobStore::Delete(const std::string& id) {
  Statement stmt(db_, "DELETE FROM jobs WHERE id = ?1");
  if (!stmt.ok()) return Error("preparing a delete");
  sqlite3_bind_text(stmt.get(), 1, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
  if (sqlite3_step(stmt.get()) != SQLITE_DONE) return Error(absl::StrCat("forgetting job ", id));
  return absl::OkStatus();
}

}  // namespace ferry
