// placeholder: the writer owner defines the independent writer reference here.
#pragma once
