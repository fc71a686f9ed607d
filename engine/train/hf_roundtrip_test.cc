// Export and init_from are each other's inverse, bit for bit, for every
// family: a trained model's weights exported in its Hugging Face layout
// (the fused q/k/v and gate/up layers split into their projections), then
// written as a model folder of two shards with their index and config.json,
// read back through model.init_from give exactly the trained fp32 values,
// and config.json reads back as the model. A vocabulary trained in pieces
// (VocabPieces) exports as the one matrix it is, and reads back into a
// model of either layout.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/checkpoint/test_files.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt.h"
#include "engine/model/hf_layout.h"
#include "engine/train/hf_export.h"
#include "engine/train/hf_import.h"
#include "engine/train/restore.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

class Quiet : public TrainingObserver {
 public:
  void OnStep(const StepReport&) override {}
};

class HfRoundTripTest : public ::testing::TestWithParam<const char*> {};

TEST_P(HfRoundTripTest, ExportThenInitFromIsBitForBit) {
  for (int64_t piece_rows : {0, 96}) {
    SCOPED_TRACE(::testing::Message() << "model.vocab_piece_rows " << piece_rows);
    ModelConfig config = *ModelPreset(GetParam());
    config.seq_len = 16;
    config.vocab_piece_rows = piece_rows;
    TrainOptions train;
    train.steps = 3;
    train.batch_size = 2;
    train.lr = 1e-2;
    train.threads = 1;
    SimulatedDevice device(1ull << 30);
    EngineOptions engine;
    engine.device = &device;
    engine.memory = MemoryOptions();
    engine.checkpoint_every_steps = train.steps;
    CheckpointContents checkpoint;
    engine.on_checkpoint = [&](CheckpointContents c, double) {
      checkpoint = std::move(c);
      return absl::OkStatus();
    };
    Quiet quiet;
    ASSERT_TRUE(Trainer(config, train, engine, std::make_unique<SyntheticSource>(config.vocab_size, 2, 3, 1), &quiet)
                    .Run()
                    .ok());
    absl::StatusOr<NamedTensors> trained =
        RestoreParameters(config, train, MemoryOptions(), {&checkpoint}, &device, 0, 1);
    ASSERT_TRUE(trained.ok()) << trained.status();
    absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
        ExportHfWeights(config, train, MemoryOptions(), {&checkpoint}, &device);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    ASSERT_EQ(tensors->size(), HfTensors(config).size());

    // Two shards, their index, config.json.
    const std::string dir = testing::EmptyTestPath(absl::StrCat("hf-roundtrip-", GetParam(), "-", piece_rows));
    ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
    const size_t half = tensors->size() / 2;
    std::string index = R"({"metadata": {}, "weight_map": {)";
    for (size_t i = 0; i < tensors->size(); ++i) {
      index += absl::StrCat(i ? ", " : "", "\"", (*tensors)[i].name, "\": \"model-0000", i < half ? 1 : 2,
                            "-of-00002.safetensors\"");
    }
    std::ofstream(dir + "/model.safetensors.index.json") << index << "}}";
    for (int shard = 1; shard <= 2; ++shard) {
      std::vector<SafetensorsTensor> part(tensors->begin() + (shard == 1 ? 0 : static_cast<long>(half)),
                                          shard == 1 ? tensors->begin() + static_cast<long>(half) : tensors->end());
      std::string bytes;
      ASSERT_TRUE(SerializeSafetensors(part, {}, &bytes).ok());
      std::ofstream(absl::StrCat(dir, "/model-0000", shard, "-of-00002.safetensors"), std::ios::binary) << bytes;
    }
    std::ofstream(dir + "/config.json") << HfConfigJson(config);
    absl::StatusOr<HfConfig> read = ReadHfFolderConfig(dir);
    ASSERT_TRUE(read.ok()) << read.status();
    read->model.seq_len = config.seq_len;
    EXPECT_EQ(read->model.ParameterCount(), config.ParameterCount());
    EXPECT_EQ(read->model.QkvRows(), config.QkvRows());
    EXPECT_EQ(read->model.tied, config.tied);

    // Restored whole, whatever the layout trained in.
    for (const auto& named : *trained) EXPECT_EQ(named.first.find("weight_"), std::string::npos) << named.first;

    // Read back into a model built without its values, as the chunks are:
    // with its vocabulary whole, and in pieces of 64 rows.
    const std::map<std::string, at::Tensor> values(trained->begin(), trained->end());
    for (int64_t rows : {0, 64}) {
      ModelConfig back = read->model;
      back.vocab_piece_rows = rows;
      Gpt model(back, nullptr, GptImpl::ParameterInit::kDeferred);
      ASSERT_EQ(model->vocab_pieces(), rows > 0 ? 4 : 1);
      ASSERT_TRUE(InitFromWeights(dir, back, *model).ok());
      model->Materialize();
      for (const auto& p : model->named_parameters()) {
        std::string base = p.key();
        int k = 0;
        const bool piece = ParseVocabPiece(p.key(), &base, &k);
        ASSERT_TRUE(values.count(base)) << p.key();
        at::Tensor expected = values.at(base);
        if (piece) {
          const VocabRows rows_of = VocabPieceRows(back, model->vocab_pieces(), k);
          expected = expected.reshape({config.vocab_size, -1}).narrow(0, rows_of.begin, rows_of.size);
        }
        EXPECT_TRUE(at::equal(p.value(), expected.to(at::kFloat).reshape(p.value().sizes()))) << p.key();
      }
      EXPECT_EQ(model->named_parameters().size(), trained->size() + (rows > 0 ? (config.tied ? 3 : 6) : 0));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfRoundTripTest,
                         ::testing::Values("gpt2-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny", "qwen3-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace ferry
