#include "server/worker/training_fingerprint.h"

#include "engine/checkpoint/checkpoint_store.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace ferry {

std::string TrainingFingerprint(const ferry::v1::JobSpec& spec) {
  ferry::v1::JobSpec s = spec;
  s.clear_name();
  s.mutable_train()->clear_steps();
  s.clear_checkpoint();
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  s.SerializeToCodedStream(&coded);
  coded.Trim();
  return Fingerprint(bytes);
}

}  // namespace ferry
