// The records of a TensorBoard event file, serialised Event messages made
// with the protobuf code generated from event.proto, summary.proto and
// hparams.proto (TensorBoard's field numbers), as PyTorch's
// torch/utils/tensorboard/summary.py makes them. The only file that sees
// protobuf: what it hands out is bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "train/tensorboard/histogram.h"

namespace ddp::tensorboard {

// An Event's when: seconds since the epoch, and the step (0 when PyTorch
// would leave it unset).
struct When {
  double wall_time = 0;
  int64_t step = 0;
};

// file_version "brain.Event:2": every file's first record, naming the
// writer ("ddp.SummaryWriter"; TensorBoard's own writer names itself) when
// `first`; a purge step repeats it without.
std::string file_version_event(When when, bool first = true);
// SessionLog START: TensorBoard drops the run's earlier records with step >= when.step.
std::string session_start_event(When when);
// A scalar as Summary.Value.simple_value (a float, as PyTorch writes it).
std::string scalar_event(const std::string& tag, double value, When when);
std::string histogram_event(const std::string& tag, const Histogram& histogram, When when);
// The text plugin's record: tag "<tag>/text_summary", a DT_STRING tensor of one.
std::string text_event(const std::string& tag, const std::string& text, When when);
// The HParams plugin's experiment, session-start and session-end records,
// in that order. A value is a number or a string.
std::vector<std::string> hparams_events(const std::map<std::string, std::variant<double, std::string>>& hparams,
                                        const std::map<std::string, double>& metrics, When when);

}  // namespace ddp::tensorboard
