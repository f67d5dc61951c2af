// Placeholder: this family's codecs are not written yet; quant.cpp reports the types as
// having no codec until they are.
#include "quant/codec.h"

namespace kiln {

std::span<const RowCodec> iquant_codecs() { return {}; }

}  // namespace kiln
